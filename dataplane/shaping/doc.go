// Package shaping limits the bandwidth of one network device's egress with
// an HTB root qdisc (Shaper), from a Limit (rate, burst, ceil) that it
// validates. It uses github.com/vishvananda/netlink on a *netlink.Handle
// opened in the device's namespace, plus one hand-built netlink request
// for the bfifo leaf, and never execs tc. Which devices are shaped, and
// how a container's egress reaches one, is the data plane's and tcfilter's
// business (see tcfilter's "Bandwidth limits").
//
// Files: limit.go holds the fifo leaf sizing of a Limit (rate.Limit, with its validation; portable, no kernel
// call); shaper_linux.go the Shaper (Read, Apply, Drain, Remove);
// fifo_linux.go the bfifo request.
//
// The HTB layout on a shaped device: root qdisc 1: with default
// class 1:1 (so nothing bypasses the class through HTB's unclassified
// direct queue), one class 1:1, and a leaf qdisc 10: under it. Class 1:1
// has no parent, so it sends only while both of its token buckets allow:
// rate/burst (the sustained limit) and ceil/cburst. With no ceil, ceil =
// rate and cburst = burst: a plain token bucket whose burst leaves at line
// speed. With a ceil, cburst is small, so a burst leaves at most at ceil
// (tbf's peakrate). Rates count what the qdisc counts: Ethernet frames
// without FCS, so TCP goodput is ~4% below the rate at MTU 1500.
//
// Changing a limit is an in-place class change (RTM_NEWTCLASS without
// NLM_F_CREATE): no qdisc is recreated and no queued packet is dropped. The
// leaf is fq_codel when the kernel has it, else a bfifo sized to ~100 ms at
// the rate (at least 128 KiB: GSO packets reach 64 KiB), resized in place
// when the rate changes (see fifo_linux.go for why bfifo needs a raw
// request). Apply compares the kernel's class with the wanted one and
// leaves a matching one alone (a restarted daemon re-applying its limits
// recreates nothing).
//
// Tested by unit tests of Limit (go test ./shaping, any user) and, as
// root, against the real kernel in a sandbox namespace (create, change in
// place, drain, remove, repair of a half-built or foreign root qdisc);
// tcfilter's TestShapingTraffic and dataplane's TestBandwidthLimits
// measure the rates with real TCP.
package shaping
