// Package tcfilter is the heart of isolatord's data plane: tc u32
// classifiers with mirred actions, under the ingress hook of a clsact (or
// ingress) qdisc, that steer packets by port between the host and the
// containers that share its address and MAC. It uses
// github.com/vishvananda/netlink on a *netlink.Handle opened in the target
// namespace and never execs tc. How a shared port's flows are spread over
// its holders is decided by package ephemeral/spread (pure); HTB shaping is
// package dataplane/shaping.
//
// The design (hooks per device, priorities, table ids, node ids, the host
// demux, the veth's egress rule, IPv6, drops, shaping, limits and the kernel
// behaviour this code depends on) is described in docs/datapath.md; each
// file's header says what it does. This comment is the map.
//
// # Files
//
// Common to every device:
//
//	layout.go              priorities, table ids, handles, classids, match keys
//	ops.go                 one filter operation (build, add, replace, delete, dump), the hook
//	actindex.go            mirred actions shared by index (one per target, per reason)
//	drops.go               drop reasons; a veth's counts per reason
//
// The host demux (HostDemux, host eth0 and host lo ingress):
//
//	hostdemux.go           the type and its in-memory index
//	hostdemux_layout.go    its fixed tables and nodes, the nodes of a range
//	hostdemux_init.go      Init: build, rebuild the index from one dump, repair
//	hostdemux_ranges.go    AddRanges, DelRanges: exclusive ranges
//	hostdemux_unroute.go   removing several containers' paths at once
//	hostdemux_tables.go    H2 tables made and dropped on demand, the stale list, Flush
//	hostdemux_shared.go    shared ports: spread tables, SetSpread, Unshare
//	hostdemux_drain.go     draining holders' marker nodes, refusing buckets
//	hostdemux_shareduse.go last use of a spread node: the host's evidence of a live flow
//	hostdemux_icmp.go      ICMP to the host IP: errors by quoted port, echo by identifier
//	hostdemux_fanout.go    the ICMP fan-out (only without the echo programs)
//	hostdemux_entries.go   Entries read from the kernel; Known, SharedHolders from the index
//	hostdemux_dst.go       SetDst: the host's IPv4 address changed at run time
//	ipv6.go                IPv6's priority, tables and keys
//	hostdemux6.go          the demux's IPv6 classifier
//	hostdemux6_frag.go     its first-fragment root nodes (ports after a fragment header)
//	containerfrag.go       a container's fragments to the host's addresses go out via the host
//
// A container's devices:
//
//	veth.go                VethFilters (host-side veth: what a container may send),
//	                       ContainerFilters (its own lo and eth0)
//	veth6.go, container6.go  their IPv6 nodes
//	icmpstate.go           the ICMP errors a container may send
//	mld6.go                the MLD reports a container's kernel sends (DropMLD)
//	loopback.go            which loopback destination ports a container may reach
//	refresh.go             bringing a veth's fixed nodes in line after a host change
//	rebuild.go             ReadVeth: a container's record from its veth
//	mute.go                the mute filter of a torn-down container's veth
//	shaperexit.go, shaperexit6.go  the exit of an egress shaper pair
//	sink.go                the sink of the IPv6 demux's counting mirrors
//	batch.go               many requests sent together, each with its own answer
//	dropsinks.go           a sink per drop reason, its counting program, the count map
//	echo.go, echo6.go, echoown.go  echo steering and ownership (cls_bpf)
//	bpfload.go             loading the programs of package bpfprog (cilium/ebpf)
//
// Packages of their own: tcfilter/nlbatch (the netlink transport: many
// requests in one sendmsg, acks read with recvmmsg, u32 encoding) and
// tcfilter/bpfprog (the BPF programs in C, compiled by clang through bpf2go),
// tcfilter/fragbpf (later fragments steered after their first, at tcx hooks),
// tcfilter/wirebpf (host eth0's wire guard: frames over the MTU dropped at
// its tcx egress, counted under DropWire: wireguard.go).
//
// # Tests
//
// Unit tests check the handle scheme and the node layout (layout_test.go,
// spread_test.go). As root, kernel tests build every structure in a sandbox
// namespace (test/sandbox) and compare it with what tc shows
// (kernel_test.go, drops_test.go), and traffic tests send real TCP, UDP and
// ICMP through it, hostile senders included (traffic_test.go,
// icmp_traffic_test.go, spread_traffic_test.go, shaperexit_test.go).
// BenchmarkAddDelRanges measures the host demux's cost per change.
package tcfilter
