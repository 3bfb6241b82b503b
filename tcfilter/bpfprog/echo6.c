// SPDX-License-Identifier: Apache-2.0
//go:build ignore
/* ICMPv6 echo replies by learning (eth0): the twins of echo.c's programs;
 * see tcfilter/echo6.go.
 *
 *   iso_echo6_learn (eth0 egress): an ICMPv6 echo request right after the
 *   fixed header from a known origin is learned as {identifier,
 *   destination} -> origin under the ownership rules (own.h).
 *   iso_echo6_steer (eth0 ingress): an echo reply, or an ICMPv6 error
 *   (types 1..7) quoting an echo request, whose {identifier, peer} is
 *   learned is redirected to that veth or accepted for the host
 *   (TC_ACT_OK); everything else goes on to the u32 classifier. */
#include "own.h"

#define ICMPV6_ECHO_REQUEST 128
#define ICMPV6_ECHO_REPLY 129

struct echo6_key {
	__be16 id;
	__u16 zero;
	__u8 peer[16];
};

/* iso_echo6: {identifier, peer} -> its owner (struct echo_entry). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ECHO_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct echo6_key);
	__type(value, struct echo_entry);
} iso_echo6 SEC(".maps");

/* iso_echo6_quota: an origin's quota (own.h). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ORIGIN_MAX + 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct quota);
} iso_echo6_quota SEC(".maps");

/* The IPv6 header and 8 bytes of ICMPv6 after Ethernet. */
struct ipv6_icmp {
	struct ipv6 ip;
	struct icmp_echo icmp;
};

SEC("tc")
int iso_echo6_steer(struct __sk_buff *skb)
{
	struct ipv6_icmp h;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &h, sizeof h) || h.ip.next != IPPROTO_ICMPV6)
		return TC_ACT_UNSPEC;
	struct echo6_key k = {};
	if (h.icmp.type == ICMPV6_ECHO_REPLY) { /* from the peer */
		k.id = h.icmp.id;
		__builtin_memcpy(k.peer, h.ip.saddr, 16);
	} else if (h.icmp.type >= 1 && h.icmp.type <= 7) {
		/* an error quoting an echo request: to the peer */
		struct ipv6_icmp q;
		if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof h, &q, sizeof q) ||
		    q.ip.next != IPPROTO_ICMPV6 || q.icmp.type != ICMPV6_ECHO_REQUEST)
			return TC_ACT_UNSPEC;
		k.id = q.icmp.id;
		__builtin_memcpy(k.peer, q.ip.daddr, 16);
	} else {
		return TC_ACT_UNSPEC;
	}
	struct echo_entry *e = bpf_map_lookup_elem(&iso_echo6, &k);
	if (!e)
		return TC_ACT_UNSPEC;
	__u32 to = e->owner;
	if (to == 0) /* the host's: delivered to it, before the u32 demux */
		return TC_ACT_OK;
	return bpf_redirect(to, 0);
}

SEC("tc")
int iso_echo6_learn(struct __sk_buff *skb)
{
	struct ipv6_icmp h;
	__u32 origin;

	if (!origin_of(skb, &origin))
		return TC_ACT_UNSPEC;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &h, sizeof h) || h.ip.next != IPPROTO_ICMPV6 ||
	    h.icmp.type != ICMPV6_ECHO_REQUEST)
		return TC_ACT_UNSPEC;
	struct echo6_key k = {.id = h.icmp.id};
	__builtin_memcpy(k.peer, h.ip.daddr, 16);
	return learn_owned(&iso_echo6, &iso_echo6_quota, &k, origin);
}

char LICENSE[] SEC("license") = "Apache-2.0";
