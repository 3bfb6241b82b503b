/* Owned echo entries: what the learn programs (echo.c, echo6.c) do with an
 * echo request once they know its key {identifier, peer} and its origin
 * (the container's veth, or 0 for the host). The rules are in
 * tcfilter/echoown.go; the constants here must match its. */
#pragma once

#include "common.h"

#define ECHO_ENTRIES (1 << 20)     /* learned {identifier, peer} per family */
#define ECHO_QUOTA 64              /* a container's new keys per window */
#define ECHO_HOST_QUOTA 4096       /* the host's */
#define ECHO_WINDOW_SHIFT 35       /* a quota window: 2^35 ns, 34.4 s */
#define ECHO_LIVE_NS 30000000000LL /* an entry is live 30 s after a request */
#define ORIGIN_MAX 16384           /* veths and shaper exits */

/* An entry of an echo map: the origin that made it, the quota window it
 * was last counted in, and when its owner last sent a request with its key
 * (bpf_ktime_get_ns). The steer programs read only owner. */
struct echo_entry {
	__u32 owner, window;
	__u64 last;
};

/* An origin's quota: the window it counts for and the keys counted. */
struct quota {
	__u64 window, count;
};

/* iso_echo_origin: the device an echo request reached eth0 from (skb_iif:
 * a container's host veth, or its egress shaper's exit) -> the container's
 * veth. Written by the daemon (SetEchoOrigin); shared by both families. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ORIGIN_MAX);
	__type(key, __u32);
	__type(value, __u32);
} iso_echo_origin SEC(".maps");

/* Set at load: the reason code of DropEcho (an index in
 * tcfilter.DropReasons). */
volatile const __u32 echo_drop_reason;

/* origin_of returns in *origin what an echo request leaving eth0 is
 * learned as: 0 for the host's own (skb_iif 0), else the veth the origin
 * map gives for skb_iif; false for an unknown origin (not learned). */
static __always_inline bool origin_of(struct __sk_buff *skb, __u32 *origin)
{
	__u32 iif = skb->ingress_ifindex;
	*origin = 0;
	if (iif == 0)
		return true;
	__u32 *v = bpf_map_lookup_elem(&iso_echo_origin, &iif);
	if (!v)
		return false;
	*origin = *v;
	return true;
}

/* quota_take counts one against origin's quota for window in quotas;
 * false when it is used up. A window's first count resets the origin's
 * entry (two CPUs doing so at once may each count from zero: a quota is
 * exact up to the CPUs racing at a window's turn). */
static __always_inline bool quota_take(void *quotas, __u32 origin, __u64 window)
{
	struct quota *q = bpf_map_lookup_elem(quotas, &origin);
	if (!q) {
		struct quota n = {.window = window, .count = 1};
		/* not inserted (full, or another CPU first): fail closed */
		return bpf_map_update_elem(quotas, &origin, &n, BPF_NOEXIST) == 0;
	}
	if (q->window != window) {
		q->window = window;
		q->count = 0;
	}
	__u64 before = __sync_fetch_and_add(&q->count, 1);
	return before < (origin ? ECHO_QUOTA : ECHO_HOST_QUOTA);
}

/* learn_owned applies the ownership rules to the request whose key is at
 * key in the echo map echo (quotas: the family's quota map) and returns the
 * verdict: TC_ACT_UNSPEC (go on) or TC_ACT_SHOT (dropped, counted). */
static __always_inline int learn_owned(void *echo, void *quotas, void *key, __u32 origin)
{
	__u64 now = bpf_ktime_get_ns();
	__u64 window = now >> ECHO_WINDOW_SHIFT;
	struct echo_entry *e = bpf_map_lookup_elem(echo, key);

	if (!e) {
		struct echo_entry n = {.owner = origin, .window = window, .last = now};
		/* not inserted (another CPU inserted it first, or the map is
		 * full): dropped like a request that may not be learned */
		if (quota_take(quotas, origin, window) &&
		    bpf_map_update_elem(echo, key, &n, BPF_NOEXIST) == 0)
			return TC_ACT_UNSPEC;
		goto drop;
	}
	if (e->owner == origin) {
		if (e->window != (__u32)window) {
			if (!quota_take(quotas, origin, window))
				goto drop;
			e->window = window;
		}
		e->last = now;
		return TC_ACT_UNSPEC;
	}
	/* another origin's entry: anyone's once it is not live, the host's at
	 * any time. Signed: an entry refreshed on another CPU after this
	 * request read the clock is younger than now, not ancient. */
	if ((__s64)(now - e->last) >= ECHO_LIVE_NS || origin == 0) {
		if (!quota_take(quotas, origin, window))
			goto drop;
		e->window = window;
		e->last = now;
		asm volatile("" ::: "memory");
		e->owner = origin; /* the owner last: the steer program reads only it */
		return TC_ACT_UNSPEC;
	}
drop:
	if (origin == 0) /* the host's own requests are never dropped */
		return TC_ACT_UNSPEC;
	/* counted under the veth the origin map gives (skb_iif may be a
	 * shaper's exit): the sink of DropEcho receives nothing */
	count_drop(origin, echo_drop_reason);
	return TC_ACT_SHOT;
}
