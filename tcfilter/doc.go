// Package tcfilter is the heart of isolatord's data plane: tc u32
// classifiers with mirred actions, under the ingress hook of a clsact (or
// ingress) qdisc, that steer IPv4 packets by port between the host and the
// containers that share its address and MAC. It uses
// github.com/vishvananda/netlink on a *netlink.Handle opened in the target
// namespace, builds every filter struct fresh for every request (netlink's
// U32.RedirIndex prepends a mirred action each time a struct is reused, so
// it is never used) and never execs tc. How a shared port's flows are
// spread over its holders is decided by package spread (pure); HTB shaping
// is package shaping.
//
// # Files
//
// Common to every device: layout.go (priorities, table ids, handles,
// classids, match keys), ops.go (one filter operation: build, add,
// replace, delete, dump, observed per op; the clsact/ingress hook),
// batch.go (many requests sent together, each with its own answer, through
// a Conn or one at a time through the handle) and conn.go (Conn: a
// NETLINK_ROUTE socket that sends a batch in one sendmsg and reads its
// acks with recvmmsg; a container's veth, container and demux range
// requests go through one).
//
// The host demux (HostDemux, one per host eth0 and host lo), one file per
// concern: hostdemux.go (the type and its in-memory index),
// hostdemux_layout.go (its fixed tables and nodes, the nodes of a range),
// hostdemux_init.go (Init: build, rebuild the index from one dump, repair),
// hostdemux_ranges.go (AddRanges, DelRanges), hostdemux_tables.go (H2
// tables made and dropped on demand, the stale list, Flush),
// hostdemux_shared.go (shared ports: spread tables, SetSpread, Unshare),
// hostdemux_drain.go (draining holders' marker nodes, refusing buckets),
// hostdemux_icmp.go (ICMP tables: errors and echo by port),
// hostdemux_fanout.go (the ICMP fan-out without cls_bpf),
// hostdemux_entries.go (Entries from the kernel; Known, SharedHolders from
// the index), echo.go (the cls_bpf echo programs on eth0); for IPv6,
// ipv6.go (its priority, tables and keys), hostdemux6.go (the IPv6
// classifier of the demux) and echo6.go (the ICMPv6 echo programs).
//
// A container's devices: veth.go (VethFilters, the host-side veth: what a
// container may send; ContainerFilters, inside the container), drops.go
// (drop reasons and counters), mute.go (the mute filter of a torn-down
// container's veth: a cls_bpf drop in the VLAN check's classifier, ahead
// of every other), rebuild.go (ReadVeth: a container's record
// from its veth), shaperexit.go (the exit of an egress shaper pair);
// their IPv6 nodes in veth6.go, container6.go and shaperexit6.go.
//
// The drop sinks and the programs: dropsinks.go (EnsureDropSinks: a sink
// per reason, its counting program, the host's drop actions and the count
// map), sink.go (EnsureSink: the one sink of older layouts and of the IPv6
// demux's counting mirrors), bpf.go (the VLAN check and the drop
// program), bpfasm.go (a small eBPF assembler and the bpf(2) calls).
//
// # Priorities, parents, handles, classids
//
// Every device gets at most three u32 classifiers, at parent ffff:fff2 (which
// clsact and the old ingress qdisc both accept): PrioARP (1, ETH_P_ARP),
// PrioIP (2, ETH_P_IP) and, with IPv6, PrioIP6 (4, ETH_P_IPV6). Host eth0 has no ARP classifier; its prio 1 holds
// the cls_bpf echo programs (PrioEcho, ingress and egress, echo.go), its
// prio 3 the ICMPv6 ones (PrioEcho6, echo6.go). All nodes have explicit handles htid:bucket:node
// (FormatHandle prints them like tc); automatic node ids are never used
// (they wrap at 0x7ff and duplicate past 4095). Table ids are per qdisc
// hook, so every device reuses the same numbers; the kernel numbers each
// priority's root table itself (800:, 801:, ...), so ours stay below 0x800:
//
//	host demux (host eth0, host lo)           veth ingress        container
//	001  L     divisor 1   -> H1               010 -> 011 (sport)  020 -> 021 lo  (dport)
//	002  H1    divisor 256 on dport>>8         012 -> 013 (sport)  022 -> 023 eth0 (dport)
//	                                           014 host source, 015 loopback,
//	                                           016 ICMP, 017 fragments,
//	                                           018 -> 019 (quoted dport)
//	                                           01a IPv6 host source, 01b ::1,
//	                                           01c ICMPv6 (veth6.go)
//	                                           01d loopback dports (loopback.go)
//	003  ICMP  divisor 1   (eth0, hostdemux_icmp.go)
//	004  ICMP fan-out, divisor 1 (eth0; only without cls_bpf, and non-first fragments)
//	005  (was the ARP fan-out; deleted by Init)
//	006  TablePort divisor 256 on port>>8 (eth0): ICMP errors by quoted sport, echo by id
//	007  ICMPv6 divisor 1 (eth0, hostdemux6.go)
//	100+b H2_b divisor 16 on (dport>>4)&15, for dport>>8 == b
//	200..7ff spread tables of shared ports, divisor spread.Buckets
//
// A node that belongs to a container carries classid ClassMajor:slot
// (1:slot, tc prints "flowid 1:2a"), so a restarted daemon maps kernel
// objects back to containers (Entries); fan-out nodes also use the slot as
// node id. Terminal nodes without an action ("stop here, deliver to this
// device's stack") carry ffff:0. Classids mean nothing to ingress/clsact
// except that the minor becomes skb->tc_index, which nothing here reads.
//
// Port-range nodes get ids derived from the range alone (RangeNodeID):
// 0x200+log2(size) for 256 ports or more (one node per 256-port chunk, in
// H1[chunk]), else the range's index in the binary heap of the aligned
// sub-ranges of its 256-port chunk, (256>>k)+(low byte>>k) for size 2^k
// (2..511). Distinct aligned ranges meeting a chunk never share an id, so
// deletion needs no saved state, and a container's old and new ranges may
// coexist during an update. Other ids: the H1->H2 link node 0x800, a shared
// port's link node 0x400|(port&0xff), in a spread table pins 1..0x100,
// the bucket node 0x800 and the drain markers 0x900|slot>>8 (in bucket
// slot&0xff, never reached), root nodes 1..n.
//
// # Host demux (HostDemux, host eth0 and host lo ingress)
//
// Per-packet cost does not depend on the number of containers. Root nodes
// of the IP priority match TCP (1) and UDP (2) first fragments (fragment
// offset 0; on eth0 also destination == host IP), then skip the IPv4 header
// by its IHL (tc's "offset at 0 mask 0x0f00 shift 6 eat"), so L4 keys are
// right for packets with IP options, and link to L. L's one node hashes the
// destination port's high byte into H1 (this needs a table of its own: a
// node's hash is taken before its own eat, so the root cannot hash L4).
//
//   - A range of 256 ports or more: one redirect node per 256-port chunk in
//     H1[chunk] (key dport&mask == begin, mirred egress redirect to the
//     container's veth, stolen).
//   - Smaller ranges: H1[b] holds a link node (created with the first small
//     range of bucket b) to H2_b, hashed on dport bits 4..7; a range of
//     16..128 ports gets one node per 16-port chunk, a smaller one a node in
//     its bucket. Worst case ~1 + 16 key checks per packet.
//   - Ports nobody owns match nothing and go to the host stack untouched.
//   - When the last small range of a bucket leaves, the link node is deleted
//     at once and then the table; the kernel keeps an unlinked table EBUSY
//     for ~10-25 ms (the link's reference is dropped by deferred RCU work),
//     so a busy table goes on a stale list that later calls retry without
//     waiting (Flush waits; Init also sweeps unlinked H2 ids).
//     Stale tables are empty and unreachable; an H2 table id needed again is
//     simply re-linked.
//   - ARP (eth0): no classifier, so every ARP frame stays with the host and
//     none is copied to a container, whatever the number of containers.
//     Containers get their neighbours from the host's table (package
//     neighsync: they ask the daemon instead of the wire, app_solicit; the
//     daemon writes the host's entry, making the host resolve first if
//     needed). Requests for the host IP are answered by the host alone.
//   - ICMP (eth0, hostdemux_icmp.go): root node 3 (ICMP first fragment to
//     the host IP, eat) links to table 003: an echo request stops there
//     (only the host answers pings of the host IP); an error (destination unreachable
//     incl. frag-needed, time exceeded) quoting a TCP or UDP header without
//     options is hashed on the quoted source port into TablePort, whose
//     nodes (one per range and 256-port chunk, copies of the range nodes
//     keyed on the high half of the word) redirect it to the one container
//     owning that port; an error about a port nobody owns (the host's own
//     flows) stays with the host. Echo replies are first matched by the
//     cls_bpf steer program (echo.go: identifiers learned from containers'
//     and the host's own echo requests on eth0 egress; the host's win over
//     what follows), then by identifier in TablePort (a
//     pinger that binds an identifier in its own ports), then stay with
//     the host. Without cls_bpf, unattributed echo replies and errors about
//     echo requests are mirrored to every container through 004 (one
//     mirror-and-continue node per container), as are non-first ICMP
//     fragments (root node 4); with cls_bpf, fragments of a steered echo
//     reply follow its first fragment and other non-first ICMP fragments
//     stay with the host. Per ICMP packet: one hash and
//     the nodes of one 256-port chunk of TablePort (at most 256, bounded by
//     the port space, not by the number of containers).
//   - Shared ports (SetSpread, Unshare): the port's node in its H2 bucket
//     (key dport == P) links to its own spread table, hashed on source-port
//     bits 1..8 (bit 0 is skipped: Linux connect() prefers even ports) into
//     spread.Buckets (256) buckets (spread.Bucket). Each bucket ends with one
//     match-all redirect node to its holder (node id 0x800); before it, a
//     bucket may hold pins: one node per pinned client source port (key
//     sport == s, node id pinID(s) in 1..0x100) redirecting to the holder
//     that has that flow's socket. Buckets are assigned by rendezvous
//     hashing on (port, bucket, slot) (spread.Assign): adding a holder moves
//     ~1/(n+1) of the buckets, removing one moves only its buckets.
//     spread.PlanFacts makes a change keep live flows: a bucket whose holder
//     stays moves with its live flows pinned (at most spread.MaxPinsPerBucket;
//     with more it may stay, at most spread.MaxHeld buckets per holder for a
//     bounded time), and pins go once their flow has ended or gone quiet; the
//     caller (the data plane) reads the flows from the holders' namespaces,
//     and once more after the move: spread.PinLate pins flows that began between.
//     Every node of a spread table has a mirred action of its own (not the
//     veth's shared one), so its last use (SpreadUse) says when the host last
//     steered a packet through it: a flow counts as live only with that
//     evidence, which a tenant cannot fabricate from inside its namespace.
//     Changes add pins, then replace bucket nodes (FilterReplace), then
//     delete pins, so a pinned flow never meets its moved bucket unpinned.
//     Per packet: one hash, then at most spread.MaxPinsPerBucket key checks in a
//     bucket in the middle of a move (none once settled).
//     A port may lie in an exclusive range of slot s while s alone holds its
//     whole spread (a container switching the port between exclusive and
//     shared): the range node has the lower id and wins; both lead to s.
//     Unsharing unlinks the port's node, then deletes the spread table, or,
//     while the kernel holds it busy, deletes its nodes and leaves the empty
//     table to the stale list.
//     The source address is not hashed. u32 hashes one word at a fixed
//     offset from the current offset, which after the root's IHL eat is the
//     L4 header. The source address is at a fixed offset only before that
//     eat, where a hash picks a bucket of the next table; every path then
//     meets again in L, H1 and H2, so carrying that choice to the spread
//     table would take a copy of the port lookup per source-address bucket
//     (and a changed root layout, paid by every packet). Hashing the word 8
//     bytes before the L4 header reads the source address only when IHL is
//     5: a flow whose packets carry options would hash another word, and
//     one whose options change would be split. Clients' source ports are
//     random enough; clients that all send from one fixed port (NAT, some
//     UDP protocols) land on one holder.
//
// # IPv6 (PrioIP6)
//
// IPv6 gets a u32 classifier of its own (priority 4, ETH_P_IPV6) on every
// device, but no port table of its own: u32 tables belong to the hook, not
// to one priority, so its nodes link into the IPv4 classifier's tables.
// One port ownership serves both families: every range, shared-port
// spread table and TablePort node is the same node for IPv4 and IPv6, and
// adding a container costs no IPv6 node anywhere.
//
// u32 offsets are from the network header: next header at 6 (the word
// at 4), source at 8, destination at 24, the transport header at 40 when
// the next header is TCP or UDP itself. Root nodes match that next header
// (and on eth0 one destination: a host address, so one node triple per
// address, MaxHostAddrs6 at most), eat a fixed 40 bytes, and link to L:
// from there the lookup is the IPv4 one (the same hash, the same keys at
// the same L4 offsets), so per-packet cost stays flat in the number of
// containers. The link root nodes are TERMINAL "stop" nodes: a port
// nobody owns stays with the host.
//
//   - Extension headers (hop-by-hop, routing, fragment, destination
//     options, ...) put another next header at 6: such packets, fragments
//     included, are not demultiplexed and go to the host. On eth0 they are
//     counted (IPv6ToHost): a last node per address mirrors them to the
//     drop sink (which drops the copy) and lets them continue, so the
//     count costs one clone per such packet and nothing for the others.
//     (u32 has no counters here, and no gact to count with.)
//   - ICMPv6 to a host address (root node 3+3i) links to TableICMP6:
//     errors (types 0..7) quoting an IPv6 header with TCP or UDP right
//     after it are hashed on the quoted source port (at +48) into
//     TablePort, the IPv4 errors' table, and go to the one container that
//     owns the port; echo replies go by identifier (+4) through TablePort
//     (a pinger that binds an identifier among its own ports); everything
//     else, echo requests included, stays with the host, which answers
//     once. Neighbour solicitations for a host address, advertisements,
//     router advertisements and MLD stay with the host too: no ICMPv6
//     packet is copied to a container. Containers need none of them: the
//     namespace side writes their neighbour entries from the host's table
//     (as for ARP) and their routes from the host's. Before all this, the
//     ICMPv6 echo programs (echo6.go, cls_bpf at PrioEcho6 = 3 on eth0
//     ingress and egress, with the IPv4 programs) steer echo replies and
//     errors about echo requests to the container (or the host) that sent
//     the request, learned at eth0's egress as for IPv4, whatever the
//     identifier.
//   - lo: TCP and UDP of any destination (::1 and the host addresses)
//     link to L, as IPv4 does.
//
// Host-side veth ingress, IPv6 (only with host IPv6 addresses; without,
// IPv6 falls to the catch-all and is dropped as DropEthertype). Root: per
// host address i, node 1+i = [host MAC, version 6, source == address i]
// links to TableVeth6Host; node 0x40 = [MAC, 6, ::1 -> ::1] links to
// TableVeth6Loop (both default DropProtocol); then [MAC, 6] DropSource,
// [MAC] DropIPHeader, the VLAN mark DropVLAN, anything else DropMAC.
// TableVeth6Host: TCP/UDP right after the header to a host address -> eat
// 40, owned source port (TableVethLocal, the IPv4 table) -> host lo; other
// TCP/UDP -> owned source port (TableVethOut) -> eth0 (default DropPort);
// ICMPv6 -> TableVeth6ICMP (default DropICMP); hop-by-hop, routing and
// destination-options headers -> DropIPv6Ext (an option header could hide
// the transport header, and nothing the container needs carries one),
// except the MLD messages a container's kernel sends on its own, in
// exactly the kernel's form (hop limit 1, hop-by-hop with only a router
// alert for MLD and a PadN, ICMPv6 131/132/143 code 0, link-local
// source, ff02::/16) -> DropMLD (nodes 0x88.. of TableVeth6Host; from ::
// root nodes 0x38.. do the same): expected noise, counted apart so that
// drops that look like an attack are attacks (mld6.go). A fragment header right after
// the fixed header: a first fragment (offset 0) whose TCP, UDP or ICMPv6
// header follows it is checked like an unfragmented packet after an eat
// of 48 (the same port tables, the same ICMPv6 table); a first fragment
// of anything else -> DropIPv6Ext (so no header can hide behind a
// fragment header); later fragments carry no ports and go by destination
// (a host address -> host lo, else eth0), as IPv4's do: their first
// fragment passed the check or nothing can reassemble them, a later one
// cannot rewrite the ports (the first 8 bytes) and IPv6 receivers drop
// overlapping fragments. A first fragment too short to hold its ports
// makes u32 give up on the classifier: the catch-all drops it.
// TableVeth6Loop: TCP/UDP from owned ports -> host lo (fragments the
// same way). TableVeth6ICMP
// (at the ICMPv6 header; the payload length read at -36): echo request
// and reply -> eth0; errors quoting a TCP/UDP packet sent to a host
// address -> eat 48, quoted destination port owned (TableVethErr) -> eth0;
// neighbour solicitations with no option or the host MAC as source
// link-layer address -> eth0; neighbour advertisements whose target is a
// host address, with no option or the host MAC as target link-layer
// address -> eth0; every other router solicitation, router
// advertisement, solicitation, advertisement and redirect -> DropNDP. So
// nothing a container sends can change what the neighbours believe about
// a host address. An older veth (layout 2) had the catch-all at priority
// 4; Install moves it to 5 (PrioVethOther) before adding IPv6.
//
// Inside the container, IPv6 twins of the IPv4 nodes: on lo, ICMPv6 to a
// host address or ::1 stays local, TCP/UDP to them with an own destination
// port stays local, other such TCP/UDP goes out through eth0; on eth0,
// TCP/UDP to ::1 with an own port is redirected to lo (the stack drops ::1
// arriving on eth0).
//
// HostDemux keeps an index of its nodes in memory (rebuilt from one dump by
// Init, which also repairs a half-done structure left by a crash), so adds
// and deletes never dump the filter table: their cost is flat in the number
// of containers (see BenchmarkAddDelRanges).
//
// # Host-side veth ingress (VethFilters: what a container sends)
//
// The rule: a frame leaves a container's veth only if a process on the
// host that owned exactly the container's ports could have sent it.
// Everything else is redirected to the drop sink of a reason by a node that
// names the reason (Drop*). The veth's ingress hook has four classifiers:
//
//	prio 1  cls_bpf, all protocols: the VLAN check (below)
//	prio 2  u32, IPv4
//	prio 3  u32, ARP
//	prio 4  u32, IPv6 (with host IPv6 addresses; see IPv6 above)
//	prio 5  u32, all protocols: one match-all drop node, DropEthertype
//	        (LLDP, anything else; also IPv4 too short for u32 to
//	        read the keys it needs: u32 then gives up on its classifier)
//
// IPv4 root (tables 800:..): node 1 = [Ethernet source == host MAC (two
// keys at -8 and -4 from the network header), version 4 and IHL 5, source
// == host IP] links to table 014; node 2 = [same, source and destination in
// 127.0.0.0/8] links to 015; both are TERMINAL link nodes whose action (a
// redirect to the sink, DropProtocol) runs when nothing in the linked
// table matched (u32 returns to a terminal link node and takes its
// result). Then: node 3 [MAC, 0x45] -> DropSource; node 4 [MAC] ->
// DropIPHeader (options, or not version 4); node 5 [MAC == 00:..:00] ->
// DropVLAN; node 6 [] -> DropMAC.
//
// Table 014 (source = host IP): TCP/UDP first fragments to the host IP
// -> (eat IHL) 010 -> 011, own source port -> redirect host lo; to 127/8
// -> (eat IHL) 01d, an allowed destination port (loopback.go; default
// DropLoopback) -> 010 -> 011 as before;
// other TCP/UDP first fragments -> 012 -> 013, own source port -> redirect
// host eth0; each of those link nodes is TERMINAL with DropPort as its
// default. ICMP first fragments -> (eat) table 016 (default DropICMP).
// Remaining TCP, UDP and ICMP packets are non-first fragments -> table
// 017: to the host IP or 127/8 -> host lo, else eth0 (they carry no ports;
// their first part passed the port check or nothing can reassemble them;
// a later part cannot rewrite the ports, which lie in the first 8 bytes).
// Table 015 (127/8 to 127/8): TCP/UDP first fragments -> 01d (default
// DropLoopback) -> 010 -> 011 (default DropPort); non-first fragments ->
// 017. IPv6's ::1 table (01b) links to 01d the same way.
//
// Table 016 (ICMP, at the ICMP header): type 8 (echo request) and 0 (echo
// reply) -> eth0 (the echo identifier is not constrained); type 3 with
// the codes an end host sends about its own sockets (3 port unreachable,
// 13 and 10 administratively prohibited: icmpstate.go) only when the
// quoted packet has IHL 5 (key at 8), is TCP or UDP (key at
// 16) and was sent to the host IP (key at 24): such a node eats a fixed 28
// bytes (ICMP header + quoted IPv4 header) and links to 018 -> 019, keyed on
// the quoted destination port: an error about a packet one of the
// container's ports received (what a host stack sends) -> eth0. Errors that
// quote a packet with options, an ICMP packet or another container's flow
// are dropped (DropICMP); the container's stack sends errors only about
// packets it received, so nothing legitimate is lost. Every other
// unreachable code (fragmentation needed included), source quench,
// redirect, time exceeded and parameter problem -> DropICMPState: a peer
// applies them to the shared address, not to one socket.
//
// ARP (prio 3): node 1 = [Ethernet source == host MAC, Ethernet/IPv4,
// 6/4, op 1 (request), sender MAC == host MAC, sender IP == host IP] ->
// eth0; node 2 [MAC == 00:..:00] -> DropVLAN; node 3 [] -> DropARP. The
// host's own stack answers every ARP request for the host IP that reaches
// eth0, so a container's ARP replies are not needed and are dropped
// (containers' replies to the ARP fan-out would only duplicate the host's).
// Nothing a container sends can change what the neighbours believe about
// the host IP: its requests carry the true mapping.
//
// Per packet this is a constant number of key checks, whatever the number
// of containers: a legitimate TCP/UDP packet costs the 4 keys of root
// node 1 plus what it cost before (its table-014 node and the port lookup).
// Node ids of the veth follow from their meaning (the drop nodes are fixed
// nodes, counted per reason), so Retarget, Install after a restart and Drops
// find them from handles alone; Install brings a veth of an older layout
// (ARP at prio 1, default "stop" node; before layout 4: an action per node) up
// to date.
//
// With an egress limit every redirect that is not a drop, ARP included,
// goes to the container's shaper (Via), so an ARP flood is shaped too.
//
// # Drops (the sinks, the counts and the VLAN check)
//
// This kernel has no gact, police or act_bpf, so no "action drop". Drop
// nodes redirect (mirred, stolen) through the host's mirred action of
// their reason (one per reason for the whole host, index
// dropIndexBase|reason, shared by every veth's nodes: actindex.go) to the
// reason's sink DropSinkName(reason), an ifb that is up, has IPv6 off and
// forwards nothing, whose egress hook holds one cls_bpf filter in
// direct-action mode: a program that adds one to the entry {skb_iif,
// reason} of a BPF hash map and returns TC_ACT_SHOT, so the packet dies in
// dev_queue_xmit before ifb_xmit (which would re-inject it into the
// veth). mirred sets skb_iif to the device it ran on, the container's
// veth, so the map holds per-container, per-reason counts read with
// bpf(2) lookups (DropSinks.Counts, All): no dump, no rtnl, and no mirred
// action of a container's own, which every link deletion on the machine
// would walk. The programs are loaded with the bpf syscall from
// hand-written instructions (dropsinks.go, bpfasm.go); their filter names
// carry a digest of the code, and a restarted daemon adopts the map the
// programs use, so counts survive it. An ifindex can be handed out again
// once its device is gone: a veth's entries are deleted at its teardown
// (Release), at its creation (Reset) and, at start-up, for veths that are
// gone (Prune). A veth of a layout before 5 (drop actions of its own, to
// the one sink SinkName) is moved to the host's actions by Install, which
// adds what its old actions counted to the map; the kernel deletes an old
// action once no node is bound to it. When the kernel cannot load the
// programs the sinks are kept down: mirred then drops what is redirected
// to a down device (with a rate-limited "device is down" kernel notice),
// uncounted per container (ErrNoDropCounts), and the VLAN check is not
// attached. A sink deleted and re-created gets another ifindex:
// EnsureDropSinks re-points the host's action (a replace of the action
// itself, seen at once by every node bound to it).
//
// The one sink SinkName of earlier layouts stays, with a program that only
// drops: the IPv6 demux's counting mirrors copy to it.
//
// VLAN: the receive path moves an 802.1Q/802.1ad tag into skb metadata
// before tc runs, so u32 sees the inner packet, and a redirect to eth0
// would put the tag back on the wire (VLAN hopping). The VLAN check
// (cls_bpf, prio 1, direct action) overwrites a tagged frame's Ethernet
// source with zeros and returns TC_ACT_UNSPEC, so the u32 priorities drop
// it with DropVLAN (a direct-action drop would be counted only per qdisc:
// netlink's cls_bpf has no actions). An untagged frame with an all-zero
// source counts as vlan too. It costs every frame of the container one
// run of a JIT-compiled program (three instructions for an untagged frame).
//
// ShaperExit (the exit of a limited container's shaper) forwards by
// destination without checking: only the veth's redirects feed the
// shaper entry, which has no address and no route.
//
// # Inside the container (ContainerFilters)
//
// lo: ICMP to the host IP or 127.0.0.0/8 stays local; TCP/UDP first
// fragments to the host IP or 127/8 whose destination port is the
// container's own stay local (terminal, no action); every other first
// fragment to the host IP or 127/8 is redirected to eth0, i.e. leaves to the
// host or another container. Non-first fragments stay local: fragmented
// datagrams inside the container work, while those to the host or other
// containers cannot be demultiplexed anyway (see below). eth0: TCP/UDP to
// 127/8 with an own destination port (coming back from the host's lo) is
// redirected to lo.
//
// # Bandwidth limits (ShaperExit, VethFilters.Via)
//
// Mesos shaped a container's egress with HTB on the container's own eth0,
// where a root process in the container can delete it. Here both
// directions are shaped on devices of the host namespace, which nothing in
// the container can reach:
//
//   - Ingress (to the container): an HTB root qdisc (package shaping) on
//     the host end of the container's veth. Every packet for the container leaves through that
//     device's egress: the host demux redirects (eth0 and lo), the ARP/ICMP
//     fan-out mirrors and the traffic of other containers all end in
//     dev_queue_xmit on it.
//
//   - Egress (from the container): its packets enter the host at the veth's
//     ingress hook, where no qdisc can queue them, and leave through host
//     eth0 or host lo, whose qdiscs are shared with the host (and real eth0
//     may be mq). So a container with an egress limit gets its own "shaper"
//     veth pair in the host namespace, entry A and exit B (named by the
//     data plane, carrying the host MAC and MTU, no address, IPv6 off,
//     forwarding off). The veth's IP redirect nodes point at A instead of
//     host eth0/lo (VethFilters.Via; VethFilters.Retarget switches a
//     running container without touching the match keys); A's root qdisc
//     is the HTB (package shaping); A transmits into B, whose ingress
//     filters (ShaperExit) send each packet where the veth would have: ICMP -> host eth0;
//     destination host IP or 127.0.0.0/8 -> host lo; everything else -> host
//     eth0; ARP -> host eth0 (ARP is shaped too). The veth keeps
//     deciding what the container may send (its source ports), so the
//     shaper exit needs no per-container state. Only limited containers pay
//     for the extra hop (a veth transmit, one more u32 lookup of 4 nodes).
//
//     Why not ifb: ifb re-injects a packet that was redirected to it from
//     an ingress hook into the ingress of the device it came from with
//     tc_skip_classify set, so the veth's redirect filters would not run a
//     second time and the packet would fall to the veth's own stack (which
//     drops it). Checked on this kernel: with "redirect to ifb" as the
//     first of two match-all filters on a veth's ingress, each datagram
//     hit the first filter once, passed the ifb and was delivered to the
//     veth's own stack; the second filter never matched. A packet redirected from an egress hook would be sent out
//     of the original device, which is the container side. Shaping on host
//     eth0 and lo instead would mean changing the host's root qdiscs and
//     classifying every host packet.
//
// # Limits
//
//   - Non-first IPv4 fragments have no ports: the host demux leaves them to
//     the host, so fragmented UDP towards a container does not work (TCP
//     sets DF). Mesos had the same limit, worse (it classified payload bytes).
//   - IPv6 packets with extension headers (fragments included) are never
//     demultiplexed: they go to the host (counted on eth0), and a
//     container cannot send them (DropIPv6Ext; its own MLD reports are
//     DropMLD).
//   - VLAN-tagged frames
//     (without hardware tag stripping) never match the host demux; the eth0
//     demux matches one host address.
//   - A container cannot send IP options (a host process could, with
//     IP_OPTIONS): the veth checks every key at fixed offsets, and
//     containers have no use for them.
//   - No ARP frame and no ICMP packet is cloned per container. Without
//     cls_bpf (detected at Init, one log line), echo replies no container's
//     ports attribute and non-first ICMP fragments are still fanned out (one
//     clone per container). Adding or removing a fan-out node costs
//     O(containers) in the kernel (its node list is sorted and walked);
//     ~0.2 ms at 1,000 containers.
//   - ICMP errors quoting a packet with IP options, or a shared port's flow,
//     stay with the host.
//
// # Kernel behaviour this code depends on (6.18)
//
//   - A node's keys are evaluated at the current offset; its hash is taken
//     before its own eat; actions run only on TERMINAL nodes; a mirred
//     action returning TC_ACT_UNSPEC makes u32 try the next node; when a
//     linked table has no match, u32 returns to the link node and, if it is
//     TERMINAL, takes its result (used to stop after the ICMP fan-out).
//   - FilterReplace keeps a node's keys (only classid, link and actions
//     change), so keys are never changed in place; here keys follow from
//     handles, and replace is used only for targets.
//   - Adding a root-table node (handle with table id 0) that exists fails
//     with ENOSPC, not EEXIST: root nodes are reconciled from a dump
//     (syncFixed), never added blindly. Deleting needs the real 80x: id.
//   - Deleting a priority frees its other tables only when it is the last
//     u32 classifier of the hook; removing a structure (dropARP, the
//     tests' clearAll) therefore deletes root nodes, then our tables
//     top-down, then the priorities.
//   - netlink's FilterList does not return hash tables (they have no
//     selector); tables are known from link nodes, node handles and ids.
//   - netlink copies cap(Sel.Keys) keys, so selectors are built with exact
//     capacity.
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
