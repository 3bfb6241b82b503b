// Package fragbpf steers the later fragments of a datagram to the
// container its first fragment went to. The host demux (package tcfilter)
// decides by destination port, which only a datagram's first fragment
// carries; without this package every later fragment stays with the host
// and the container never reassembles the datagram.
//
// # The path
//
// Two programs in C (frag.c, compiled by clang through bpf2go; the
// generated frag_bpfel.go and frag_bpfel.o are committed) share three
// maps: frag4 and frag6, LRU hash tables of Size datagrams each (the
// daemon's --fragment-table-size, DefaultSize 8192), and counts, per-CPU
// counters.
//
//   - learn, at the tcx egress of every container's host-side veth: every
//     packet the host sends to the container passes there (the demux's
//     mirred redirects from eth0 and lo, and steered fragments). A first
//     fragment (offset 0, more fragments set) of a TCP or UDP datagram
//     records the veth's ifindex under {source, destination, protocol,
//     IP id} (IPv4) or {source, destination, identification} (IPv6).
//   - steer, at the tcx ingress of host eth0 and host lo, which runs before
//     their tc filters (the u32 demux). A packet that is no fragment, or
//     not TCP/UDP, goes on to tc at once (TCX_NEXT: one load of the IP
//     header). A later fragment (offset > 0) whose key is in the table is
//     redirected to the egress of that veth (bpf_redirect, as the demux's
//     mirred does: through the veth's ingress shaping); one whose key is
//     not stays with the host, counted. A first fragment deletes its key
//     first: the demux then decides again, and learn records the result
//     if the first fragment goes to a container; if it stays with the host
//     (a port nobody owns), so do its later fragments.
//
// IPv6: only a fragment header right after the fixed header is looked at
// (as the demux does; its root nodes for first fragments are in
// tcfilter's hostdemux6_frag.go). An atomic fragment (offset 0, M clear)
// is a whole datagram: demuxed by its ports, never learned or steered.
//
// Cost per packet is one header load and, for fragments only, one hash
// lookup: flat in the number of containers.
//
// tcx (Linux 6.6) rather than cls_bpf: the steer program must run before
// the u32 demux on eth0 and lo, whose first priorities belong to other
// filters, and a container's veth has an ingress qdisc only (no egress
// hook) so that adding a container walks fewer filter blocks; tcx hooks
// need no qdisc. The programs are attached with BPF_PROG_ATTACH (no link
// to pin), so they stay attached when the daemon exits and go with their
// device. bpf(2) resolves an ifindex in the calling thread's namespace,
// hence Runner.
//
// # Isolation
//
//   - A later fragment only ever goes to the veth its datagram's newest
//     first fragment went to: the demux decided that by port; the programs
//     never choose a container themselves.
//   - No fragment is copied: bpf_redirect moves the packet.
//   - A tenant cannot write the tables: learn runs at the host side of the
//     veth, in the host's direction towards the container; what the
//     container sends enters at the veth's ingress, where nothing learns.
//     What the demux redirects from the host's lo is not learned either:
//     every container's and the host's packets there carry the host's
//     address as source, so a tenant sending crafted first fragments to
//     its own port through the host IP could otherwise fill the shared
//     table at local speed, or claim the key of another container's
//     datagram over lo. Nothing reaches a container over lo fragmented
//     unless crafted: with the wire guard, lo paths carry whole datagrams
//     (TestFragmentTenantCannotStealHostDatagrams).
//   - A first fragment from a spoofed source can move a key to another
//     container, as an IPv4 host's reassembly can be fed a forged first
//     fragment: an outsider who can spoof a sender's address and predict
//     its IP ids (IPv6 ids are 32-bit and random on Linux) can have the
//     rest of one datagram sent to the container owning the port of its
//     forged first fragment. The host itself is no more exposed than
//     without the programs.
//
// # The table's rule (evictions)
//
// An entry is dropped only to make room when the table is full, least
// recently used first; the kernel's LRU lists are per CPU, so up to 128
// entries per CPU may go earlier. So a datagram whose later fragments
// arrive before Size - 128×CPUs newer datagrams have been learned is
// delivered whatever a flood does (TestFragmentFlood, dataplane). Only
// first fragments the demux sends to a container take an entry: a flood
// to ports nobody owns takes none. Evictions are counted as learned -
// forgotten - entries now (Counts).
//
// # Limits
//
//   - Reordering: a later fragment that arrives before its first fragment
//     finds no entry and stays with the host (counted as left to the
//     host); the datagram is lost (the container gets the first fragment
//     alone) and the sender's retry, with a new id, gets through. Nothing
//     is held back (a tc program cannot queue a packet).
//   - Restart: a restarted daemon reuses the tables of the programs it
//     finds on lo (Load's adoptFrom) when their shape is the same; with
//     another --fragment-table-size it starts them empty and replaces the
//     programs everywhere (Adopt re-attaches learn on every veth).
//   - Entries are not removed when a container goes; a later fragment of
//     its datagrams is then redirected to a device that is gone and
//     dropped (the host could not have reassembled it either). Ifindexes
//     are handed out cyclically, so a new veth does not take over a
//     live entry.
//   - The host's own datagrams over lo larger than the veth's MTU (lo's
//     MTU is 65536, so they are not fragmented) are still dropped at the
//     veth: see docs/fragments.md.
package fragbpf
