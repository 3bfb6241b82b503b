package main

import (
	"fmt"
	"io"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
)

// writeFragments prints the status lines of the fragment steering: later
// fragments steered, left to the host, and the table's evictions.
func writeFragments(w io.Writer, f *pb.FragmentSteering) {
	switch {
	case f == nil:
		return // a daemon that predates it
	case !f.GetEnabled():
		fmt.Fprintf(w, "Fragments:\tnot steered (the kernel cannot run the programs): later fragments stay with the host\n")
		return
	}
	fmt.Fprintf(w, "Fragments steered:\t%d (IPv4 %d, IPv6 %d)\n",
		f.GetSteeredIpv4()+f.GetSteeredIpv6(), f.GetSteeredIpv4(), f.GetSteeredIpv6())
	fmt.Fprintf(w, "Fragments left to host:\t%d (IPv4 %d, IPv6 %d)\n",
		f.GetToHostIpv4()+f.GetToHostIpv6(), f.GetToHostIpv4(), f.GetToHostIpv6())
	fmt.Fprintf(w, "Fragment table:\t%d datagrams, %d evicted (size %d per family)\n",
		f.GetTableEntries(), f.GetTableEvictions(), f.GetTableSize())
}
