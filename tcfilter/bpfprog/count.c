// SPDX-License-Identifier: Apache-2.0
//go:build ignore
/* iso_drop_count: the program on the egress of a drop sink (an ifb per
 * reason, tcfilter/dropsinks.go). mirred set skb_iif to the device it ran
 * on, the container's veth: the program adds one to the count map's entry
 * {skb_iif, reason} and drops the frame. */
#include "common.h"

/* The sink's reason (an index in tcfilter.DropReasons), set at load. */
volatile const __u32 drop_reason;

SEC("tc")
int iso_drop_count(struct __sk_buff *skb)
{
	count_drop(skb->ingress_ifindex, drop_reason);
	return TC_ACT_SHOT;
}

char LICENSE[] SEC("license") = "Apache-2.0";
