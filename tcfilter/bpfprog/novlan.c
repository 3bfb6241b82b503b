// SPDX-License-Identifier: Apache-2.0
//go:build ignore
/* iso_novlan: marks a frame that carried an 802.1Q/802.1ad tag. The
 * receive path moves the tag into skb metadata before tc runs, so u32 sees
 * the inner packet, and a redirect to eth0 would put the tag back on the
 * wire. The program overwrites such a frame's Ethernet source with zeros
 * (tcfilter.VLANMarkMAC), so that every u32 priority of the veth drops it
 * with reason DropVLAN, and lets every frame go on to the next filter
 * (TC_ACT_UNSPEC). It cannot drop the frame itself and have it counted: a
 * direct-action drop is counted only per qdisc. */
#include "common.h"

SEC("tc")
int iso_novlan(struct __sk_buff *skb)
{
	if (skb->vlan_present) {
		__u8 zero[6] = {};
		bpf_skb_store_bytes(skb, 6, zero, sizeof zero, 0);
	}
	return TC_ACT_UNSPEC;
}

char LICENSE[] SEC("license") = "Apache-2.0";
