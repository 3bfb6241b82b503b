package main

import (
	"log/slog"
	"os"
	"runtime"
)

// spareProcs raises GOMAXPROCS from the CPUs Go runs on (cpus) to those
// plus the bound on calls that change containers (defaultWrites), unless
// the GOMAXPROCS environment variable sets it. Call it after
// dataplane.New, whose own bound on writers is sized from GOMAXPROCS.
//
// Those calls are kernel work: a goroutine doing one keeps its P across
// back-to-back netlink syscalls. With no more Ps than CPUs, a burst's
// writers hold every P; nothing then waits in the network poller, so a
// read's bytes arriving on the socket are noticed only when the runtime's
// monitor polls (every 10 ms when busy), and the connection's reader and
// writer goroutines then queue behind the writers: reads took up to
// 10-12 ms in steps of that poll. With more Ps than writers can hold, a P
// is always idle, its thread waits in the poller, and a read runs as soon
// as the kernel gives its thread a CPU (the kernel shares the CPUs among
// the threads; the writers stay bounded as before).
func spareProcs(log *slog.Logger) {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	procs := cpus + defaultWrites()
	runtime.GOMAXPROCS(procs)
	log.Debug("GOMAXPROCS raised above the CPUs so that writers cannot hold every P", "cpus", cpus, "gomaxprocs", procs)
}
