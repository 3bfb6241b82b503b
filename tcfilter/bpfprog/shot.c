// SPDX-License-Identifier: Apache-2.0
//go:build ignore
/* isolatord_drop: drops every frame (this kernel has no gact, so no
 * "action drop"). It runs on the egress of the drop sink SinkName and as
 * the mute filter of a torn-down container's veth (tcfilter/mute.go). */
#include "common.h"

SEC("tc")
int isolatord_drop(struct __sk_buff *skb)
{
	return TC_ACT_SHOT;
}

char LICENSE[] SEC("license") = "Apache-2.0";
