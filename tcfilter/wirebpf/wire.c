//go:build ignore

// SPDX-License-Identifier: GPL-2.0
//
// Wire guard (package wirebpf): at the tcx egress of host eth0, drop a
// frame larger than the device takes (MTU + Ethernet header, + 4 when the
// frame carries a VLAN tag in its data, the rule of af_packet's sends),
// and a GSO packet whose segments would be (a tenant's packet socket with
// PACKET_VNET_HDR chooses gso_size; a veth passes GSO packets whatever
// their size). Counted by the interface the frame
// entered the host on (a container's host-side veth, for what its filters
// redirected here).

#include <linux/types.h>
#include "../bpfprog/common.h"

#define TCX_NEXT (-1)
#define TCX_DROP 2

#define VLAN_HLEN 4
#define ETH_P_8021Q 0x8100
#define ETH_P_8021AD 0x88A8

/* iso_drops, the drop count map (common.h): the data plane hands the drop
 * sinks' map over at load. */

/* The reason counted (an index in tcfilter.DropReasons), set at load. */
volatile const __u32 drop_reason;

SEC("tcx/egress")
int wire_guard(struct __sk_buff *skb)
{
	__u32 mtu = 0;
	// A GSO packet passes when each of its segments fits the MTU (its
	// network header, transport header and gso_size: the kernel's own
	// check for forwarded GSO packets); the host's own are cut to the MSS
	// their route gave, and pass.
	long r = bpf_check_mtu(skb, 0, &mtu, 0, BPF_MTU_CHK_SEGS);
	if (r == BPF_MTU_CHK_RET_SEGS_TOOBIG)
		goto drop;
	if (r != BPF_MTU_CHK_RET_FRAG_NEEDED || mtu == 0)
		return TCX_NEXT;
	if (skb->len <= mtu + ETH_HLEN + VLAN_HLEN) {
		__be16 proto = 0;
		if (bpf_skb_load_bytes(skb, 12, &proto, sizeof(proto)) == 0 &&
		    (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)))
			return TCX_NEXT;
	}
drop:
	count_drop(skb->ingress_ifindex, drop_reason);
	return TCX_DROP;
}

char _license[] SEC("license") = "GPL";
