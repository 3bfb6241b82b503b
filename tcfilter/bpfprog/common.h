/* Shared by the data plane's programs: packet layouts, map layouts and
 * the drop count map. Little-endian target (bpfel) only. */
#pragma once

#include <stdbool.h>
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ETH_HLEN 14
#define IPPROTO_ICMP 1
#define IPPROTO_ICMPV6 58

/* The IPv4 header without options. */
struct ipv4 {
	__u8 ver_ihl; /* 0x45: IPv4, no options */
	__u8 tos;
	__be16 len, id, frag; /* frag: flags (3 bits) and offset (13) */
	__u8 ttl, proto;
	__be16 check;
	__be32 saddr, daddr;
};

/* The fixed IPv6 header. */
struct ipv6 {
	__be32 ver_class_label;
	__be16 plen;
	__u8 next, hops;
	__u8 saddr[16], daddr[16];
};

/* The first 8 bytes of an ICMP or ICMPv6 echo message (and of an error:
 * type and code are where an echo's are). */
struct icmp_echo {
	__u8 type, code;
	__be16 check, id, seq;
};

/* An entry of the drop count map: how many frames veth dropped for reason
 * (an index in tcfilter.DropReasons). */
struct drop_key {
	__u32 veth, reason;
};

/* iso_drops: the drop count map, shared by the drop sinks' programs and the
 * echo learn programs (which get the sinks' map at load). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 16);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct drop_key);
	__type(value, __u64);
} iso_drops SEC(".maps");

/* count_drop adds one to iso_drops' entry {veth, reason}, inserting it when
 * it is missing; when another CPU inserted it first the insert fails and
 * the count goes to its entry. */
static __always_inline void count_drop(__u32 veth, __u32 reason)
{
	struct drop_key k = {.veth = veth, .reason = reason};
	__u64 *n = bpf_map_lookup_elem(&iso_drops, &k);
	if (n) {
		__sync_fetch_and_add(n, 1);
		return;
	}
	__u64 one = 1;
	if (bpf_map_update_elem(&iso_drops, &k, &one, BPF_NOEXIST) == 0)
		return;
	n = bpf_map_lookup_elem(&iso_drops, &k);
	if (n)
		__sync_fetch_and_add(n, 1);
}
