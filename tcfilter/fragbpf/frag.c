//go:build ignore

// SPDX-License-Identifier: GPL-2.0
//
// Fragment steering (package fragbpf): learn where a datagram's first
// fragment went (tcx egress of a container's host-side veth), steer its
// later fragments there (tcx ingress of host eth0 and host lo, before the
// tc u32 demux). See doc.go.

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

// tcx return codes (uapi linux/bpf.h since 6.6; this system's headers are
// older).
#define TCX_NEXT (-1)

#define ETH_HLEN 14
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define PROTO_TCP 6
#define PROTO_UDP 17
#define NEXTHDR_FRAGMENT 44
#define IP_MF 0x2000
#define IP_OFFSET 0x1fff
#define IP6_OFFSET 0xfff8
#define IP6_MF 0x0001

struct frag4_key {
	__be32 saddr;
	__be32 daddr;
	__be16 id;
	__u8 proto;
	__u8 pad;
};

struct frag6_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__be32 id;
};

// Counters, per CPU (index into counts).
enum {
	COUNT_STEERED4 = 0, // IPv4 later fragment redirected to its first's veth
	COUNT_HOST4,        // IPv4 later fragment, no entry: left to the host
	COUNT_STEERED6,
	COUNT_HOST6,
	COUNT_LEARNED,   // new entry (first fragment of a datagram to a container)
	COUNT_FORGOTTEN, // entry deleted by a newer first fragment of its key
	COUNT_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct frag4_key);
	__type(value, __u32); // ifindex of the host-side veth
	__uint(max_entries, 8192);
} frag4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct frag6_key);
	__type(value, __u32);
	__uint(max_entries, 8192);
} frag6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, COUNT_MAX);
} counts SEC(".maps");

static __always_inline void count(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&counts, &i);
	if (v)
		*v += 1;
}

// The fixed IPv6 header and a fragment header right after it.
struct ip6frag {
	__be32 vtc;
	__be16 plen;
	__u8 nexthdr;
	__u8 hlim;
	__u8 saddr[16];
	__u8 daddr[16];
	__u8 fnexthdr;
	__u8 freserved;
	__be16 frag_off;
	__be32 id;
};

struct ip4 {
	__u8 vihl;
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__be16 check;
	__be32 saddr;
	__be32 daddr;
};

// kind of an IP packet, and its key (FIRST: offset 0 and more to come;
// a datagram in one piece, an atomic fragment too, is NOT_FRAG)
enum { NOT_FRAG = 0, FIRST, LATER };

static __always_inline int parse4(struct __sk_buff *skb, struct frag4_key *k)
{
	struct ip4 ip;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
		return NOT_FRAG;
	__u16 fo = bpf_ntohs(ip.frag_off);
	if (!(fo & (IP_MF | IP_OFFSET)))
		return NOT_FRAG;
	if (ip.protocol != PROTO_UDP && ip.protocol != PROTO_TCP)
		return NOT_FRAG;
	k->saddr = ip.saddr;
	k->daddr = ip.daddr;
	k->id = ip.id;
	k->proto = ip.protocol;
	k->pad = 0;
	return (fo & IP_OFFSET) ? LATER : FIRST;
}

// Only a fragment header right after the fixed header is looked at (as the
// u32 demux does); an atomic fragment (offset 0, M clear) is a whole
// datagram.
static __always_inline int parse6(struct __sk_buff *skb, struct frag6_key *k)
{
	struct ip6frag ip;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
		return NOT_FRAG;
	if (ip.nexthdr != NEXTHDR_FRAGMENT)
		return NOT_FRAG;
	if (ip.fnexthdr != PROTO_UDP && ip.fnexthdr != PROTO_TCP)
		return NOT_FRAG;
	__u16 fo = bpf_ntohs(ip.frag_off);
	if (!(fo & (IP6_OFFSET | IP6_MF)))
		return NOT_FRAG;
	__builtin_memcpy(k->saddr, ip.saddr, 16);
	__builtin_memcpy(k->daddr, ip.daddr, 16);
	k->id = ip.id;
	return (fo & IP6_OFFSET) ? LATER : FIRST;
}

// steer runs at the tcx ingress of host eth0 and host lo, before tc. A later
// fragment whose datagram's first fragment went to a container follows it
// there (bpf_redirect to the egress of its host-side veth, as the demux's
// mirred does); a first fragment forgets what an earlier datagram of the
// same key learned (the demux then decides, and learn records it again if
// it goes to a container); everything else goes on to tc untouched.
SEC("tc")
int frag_steer(struct __sk_buff *skb)
{
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct frag4_key k;
		int kind = parse4(skb, &k);
		if (kind == NOT_FRAG)
			return TCX_NEXT;
		if (kind == FIRST) {
			if (bpf_map_delete_elem(&frag4, &k) == 0)
				count(COUNT_FORGOTTEN);
			return TCX_NEXT;
		}
		__u32 *ifindex = bpf_map_lookup_elem(&frag4, &k);
		if (!ifindex) {
			count(COUNT_HOST4);
			return TCX_NEXT;
		}
		count(COUNT_STEERED4);
		return bpf_redirect(*ifindex, 0);
	}
	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct frag6_key k;
		int kind = parse6(skb, &k);
		if (kind == NOT_FRAG)
			return TCX_NEXT;
		if (kind == FIRST) {
			if (bpf_map_delete_elem(&frag6, &k) == 0)
				count(COUNT_FORGOTTEN);
			return TCX_NEXT;
		}
		__u32 *ifindex = bpf_map_lookup_elem(&frag6, &k);
		if (!ifindex) {
			count(COUNT_HOST6);
			return TCX_NEXT;
		}
		count(COUNT_STEERED6);
		return bpf_redirect(*ifindex, 0);
	}
	return TCX_NEXT;
}

// learn runs at the tcx egress of a container's host-side veth, which sees
// every packet the host sends to the container (the demux's redirects and
// steered fragments). A first fragment of a TCP or UDP datagram records
// the veth as its datagram's destination. The tenant cannot reach this
// hook: its own packets enter the veth's ingress. Nor does it teach it
// through the host's lo: what the demux redirected from lo (mirred sets
// ingress_ifindex to the device it came in on; lo is 1 in every
// namespace) is not learned. Every container's and the host's packets
// there carry the host's address as source, so a tenant sending first
// fragments to its own port through the host IP could otherwise fill the
// shared table at local speed or claim another's key; nothing reaches a
// container over lo fragmented unless crafted (docs/fragments.md).
#define LOOPBACK_IFINDEX 1

SEC("tc")
int frag_learn(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ifindex;
	if (skb->ingress_ifindex == LOOPBACK_IFINDEX)
		return TCX_NEXT;
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct frag4_key k;
		if (parse4(skb, &k) == FIRST) {
			if (bpf_map_update_elem(&frag4, &k, &ifindex, BPF_NOEXIST) == 0)
				count(COUNT_LEARNED);
			else
				bpf_map_update_elem(&frag4, &k, &ifindex, BPF_ANY);
		}
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct frag6_key k;
		if (parse6(skb, &k) == FIRST) {
			if (bpf_map_update_elem(&frag6, &k, &ifindex, BPF_NOEXIST) == 0)
				count(COUNT_LEARNED);
			else
				bpf_map_update_elem(&frag6, &k, &ifindex, BPF_ANY);
		}
	}
	return TCX_NEXT;
}

char __license[] SEC("license") = "GPL";
