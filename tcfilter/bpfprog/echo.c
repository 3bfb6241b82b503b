// SPDX-License-Identifier: Apache-2.0
//go:build ignore
/* IPv4 echo replies by learning (eth0): see tcfilter/echo.go.
 *
 *   iso_echo_learn (eth0 egress): an echo request (IHL 5, first fragment)
 *   from a known origin is learned as {identifier, destination} -> origin
 *   under the ownership rules (own.h).
 *   iso_echo_steer (eth0 ingress): an echo reply to the host IP, or an ICMP
 *   error (type 3 or 11) quoting an echo request, whose {identifier, peer}
 *   is learned is redirected to that veth, or accepted for the host
 *   (TC_ACT_OK); the later fragments of a redirected fragmented reply
 *   follow its first; everything else goes on to the u32 demux
 *   (TC_ACT_UNSPEC). */
#include "own.h"

#define FRAG_ENTRIES 4096 /* fragmented echo replies in flight; LRU */

/* The host's IPv4 address (network byte order), set at load. */
volatile const __be32 host_ip;

struct echo_key {
	__be16 id;
	__u16 zero;
	__be32 peer;
};

/* A fragmented datagram: its source and IP id. */
struct frag_key {
	__be32 saddr;
	__be16 id;
	__u16 zero;
};

/* iso_echo: {identifier, peer} -> its owner (struct echo_entry). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ECHO_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct echo_key);
	__type(value, struct echo_entry);
} iso_echo SEC(".maps");

/* iso_echo_quota: an origin's quota (own.h). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ORIGIN_MAX + 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct quota);
} iso_echo_quota SEC(".maps");

/* iso_echo_frag: a redirected reply's first fragment {source, IP id} ->
 * the veth it went to. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, FRAG_ENTRIES);
	__type(key, struct frag_key);
	__type(value, __u32);
} iso_echo_frag SEC(".maps");

/* The IPv4 header (without options) and 8 bytes of ICMP after Ethernet. */
struct ipv4_icmp {
	struct ipv4 ip;
	struct icmp_echo icmp;
};

#define IP_MF 0x2000
#define IP_OFFSET 0x1fff

SEC("tc")
int iso_echo_steer(struct __sk_buff *skb)
{
	struct ipv4_icmp h;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &h, sizeof h) ||
	    h.ip.ver_ihl != 0x45 || h.ip.proto != IPPROTO_ICMP || h.ip.daddr != host_ip)
		return TC_ACT_UNSPEC;
	struct frag_key fk = {.saddr = h.ip.saddr, .id = h.ip.id};
	if (h.ip.frag & bpf_htons(IP_OFFSET)) {
		/* a non-first fragment: where its first fragment went */
		__u32 *to = bpf_map_lookup_elem(&iso_echo_frag, &fk);
		if (!to)
			return TC_ACT_UNSPEC;
		return bpf_redirect(*to, 0);
	}
	bool more = h.ip.frag & bpf_htons(IP_MF);
	struct echo_key k = {};
	if (h.icmp.type == 0) { /* a reply: from the peer */
		k.id = h.icmp.id;
		k.peer = h.ip.saddr;
	} else if (h.icmp.type == 3 || h.icmp.type == 11) {
		/* an error quoting an echo request: to the peer */
		struct ipv4_icmp q;
		if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof h, &q, sizeof q) ||
		    q.ip.ver_ihl != 0x45 || q.ip.proto != IPPROTO_ICMP || q.icmp.type != 8)
			return TC_ACT_UNSPEC;
		k.id = q.icmp.id;
		k.peer = q.ip.daddr;
		more = false; /* errors are not followed by fragments */
	} else {
		return TC_ACT_UNSPEC;
	}
	struct echo_entry *e = bpf_map_lookup_elem(&iso_echo, &k);
	if (!e)
		return TC_ACT_UNSPEC;
	__u32 to = e->owner;
	if (to == 0)
		/* the host's: delivered to it, before the u32 demux (where an
		 * identifier in a container's ports would send it to the
		 * container) */
		return TC_ACT_OK;
	if (more)
		bpf_map_update_elem(&iso_echo_frag, &fk, &to, BPF_ANY);
	return bpf_redirect(to, 0);
}

SEC("tc")
int iso_echo_learn(struct __sk_buff *skb)
{
	struct ipv4_icmp h;
	__u32 origin;

	if (!origin_of(skb, &origin))
		return TC_ACT_UNSPEC;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &h, sizeof h) ||
	    h.ip.ver_ihl != 0x45 || h.ip.proto != IPPROTO_ICMP ||
	    (h.ip.frag & bpf_htons(IP_OFFSET)) || h.icmp.type != 8)
		return TC_ACT_UNSPEC;
	struct echo_key k = {.id = h.icmp.id, .peer = h.ip.daddr};
	return learn_owned(&iso_echo, &iso_echo_quota, &k, origin);
}

char LICENSE[] SEC("license") = "Apache-2.0";
