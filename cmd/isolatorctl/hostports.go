package main

import (
	"fmt"
	"io"

	isolatordv1 "github.com/isolatord/isolatord/api/isolatord/v1"
)

// writeHostPorts adds the host reservation lines to the status table.
func writeHostPorts(w io.Writer, h *isolatordv1.HostPortReservations) {
	if !h.GetEnabled() {
		fmt.Fprintf(w, "Host port reservations:\toff\n")
		return
	}
	fmt.Fprintf(w, "Host port reservations:\t%s held\n", plural(uint64(h.GetReserved()), "port"))
	if len(h.GetConflicts()) == 0 {
		fmt.Fprintf(w, "Host port conflicts:\tnone\n")
		return
	}
	fmt.Fprintf(w, "Host port conflicts:\t%d (host processes bound containers' ports while the daemon was down; they get none of the traffic)\n", len(h.GetConflicts()))
	for _, c := range h.GetConflicts() {
		fmt.Fprintf(w, "  %d:\t%s\n", c.GetPort(), c.GetHolder())
	}
}
