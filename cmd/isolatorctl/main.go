// Command isolatorctl is the command-line client of isolatord. It speaks the
// daemon's gRPC protocol (package isolatordv1) over its unix socket:
//
//	isolatorctl [--socket PATH] [-o table|json] [--timeout D] COMMAND [ARGS]
//
// with one command per RPC: prepare, isolate, update, usage, cleanup, get,
// list and status. Flags may come before or after a command's container ID,
// and the global flags are accepted after the command too, so
// `isolatorctl prepare c1 --ports 31000-31099 -o json` works.
//
// Design: run parses and validates the whole command line before it connects
// (a bad port list or a missing ID exits 2 without touching the daemon),
// makes exactly one RPC, and prints the answer as a table for people or as
// JSON for scripts. The JSON is one generic mapping of the response proto
// (jsonout.go: proto field names, states as "prepared"/"isolated", 64-bit
// numbers as numbers), not protojson. A failed RPC exits
// 1 and prints the gRPC code and the daemon's message, e.g.
// "isolatorctl: FailedPrecondition: port 31001 is held exclusively by c1".
//
// Exit codes: 0 success, 1 the daemon or the connection failed, 2 bad usage.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
)

func main() {
	os.Exit(runBuffered(os.Args[1:], os.Stdout, os.Stderr))
}

// runBuffered is run with stdout written in large writes: a table writes
// each cell on its own (text/tabwriter), some 12,000 write(2) calls for a
// list of 900 containers, which took longer than the call to the daemon.
func runBuffered(args []string, stdout, stderr io.Writer) int {
	out := bufio.NewWriterSize(stdout, 64<<10)
	code := run(args, out, stderr)
	if err := out.Flush(); err != nil {
		fmt.Fprintln(stderr, "isolatorctl: write output:", err)
		code = max(code, exitError)
	}
	return code
}
