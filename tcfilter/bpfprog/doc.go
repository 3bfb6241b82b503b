// Package bpfprog holds the data plane's BPF programs: C sources compiled
// by clang through bpf2go (cilium/ebpf) into little-endian objects, and
// the Go code bpf2go generates to load them. tcfilter loads them with
// cilium/ebpf and attaches them as direct-action cls_bpf filters.
//
//	shot.c    isolatord_drop: drops every frame (the drop sink SinkName,
//	          the mute filter of a torn-down container's veth)
//	novlan.c  iso_novlan: marks a VLAN-tagged frame for the veth's u32
//	          filters to drop (tcfilter.VLANMarkMAC)
//	count.c   iso_drop_count: counts a frame per {veth, reason} in iso_drops
//	          and drops it (the per-reason drop sinks)
//	echo.c    iso_echo_steer, iso_echo_learn: IPv4 echo replies by learning
//	          on eth0 (tcfilter/echo.go)
//	echo6.c   iso_echo6_steer, iso_echo6_learn: their ICMPv6 twins
//	          (tcfilter/echo6.go)
//	own.h     the ownership rules of learned echo entries (tcfilter/echoown.go)
//	common.h  packet layouts and the drop count map
//
// Parameters (the host's address, a drop reason's code) are read-only
// globals (volatile const) set through the CollectionSpec's Variables
// before loading; maps shared between objects (iso_echo_origin, iso_drops)
// are passed as MapReplacements.
//
// # Regenerating
//
// The generated *_bpfel.go and *_bpfel.o files are committed: building and
// testing need no C toolchain. After editing a C source or header, run
//
//	make generate    # go generate ./tcfilter/...
//
// which needs clang, llvm (llvm-strip) and libbpf-dev (<bpf/bpf_helpers.h>)
// and the kernel's UAPI headers (linux-libc-dev); scripts/install-deps.sh
// installs them. Commit the regenerated objects with the sources.
package bpfprog
