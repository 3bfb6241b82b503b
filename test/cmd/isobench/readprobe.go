package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"github.com/isolatord/isolatord/api"
)

// A reader in a process of its own. The burst's read probe (readProbe)
// shares the burst's process and connection, so its latency includes the
// client's own queueing: hundreds of the burst's goroutines made runnable
// by their answers, and the connection's frames read one after another.
// A monitoring agent, or a runtime's CNI CHECK (a plugin process with a
// connection of its own), reads from another process: isobench runs
// itself as "read-probe" beside the burst's probe, and reports both.

// readProbeCmd is the hidden command a separate reader runs.
const readProbeCmd = "read-probe"

// probeOut is what a separate reader prints when its stdin closes.
type probeOut struct {
	UsageNs []int64 `json:"usage_ns"`
	GetNs   []int64 `json:"get_ns"`
	Err     string  `json:"err,omitempty"`
}

// readProbeMain polls Usage and Get of one container (readProbe) until
// stdin closes, at most limit, then prints the latencies as JSON.
func readProbeMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(readProbeCmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", "", "isolatord's socket")
	id := fs.String("id", "", "container to read")
	limit := fs.Duration("limit", 10*time.Minute, "stop after this long whatever stdin does")
	if err := fs.Parse(args); err != nil || *socket == "" || *id == "" {
		fmt.Fprintln(stderr, "isobench read-probe: need --socket and --id")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *limit)
	defer cancel()
	cc, err := api.Dial(ctx, *socket)
	if err != nil {
		fmt.Fprintln(stderr, "isobench read-probe:", err)
		return 1
	}
	defer cc.Close()
	r := &readProbe{}
	stop := r.start(ctx, cc, *id)
	closed := make(chan struct{})
	go func() {
		io.Copy(io.Discard, stdin)
		close(closed)
	}()
	select {
	case <-closed:
	case <-ctx.Done():
	}
	stop()
	out := probeOut{UsageNs: nanos(r.usage), GetNs: nanos(r.get)}
	if r.err != nil {
		out.Err = r.err.Error()
	}
	if err := json.NewEncoder(stdout).Encode(out); err != nil {
		return 1
	}
	return 0
}

func nanos(ds []time.Duration) []int64 {
	out := make([]int64, len(ds))
	for i, d := range ds {
		out[i] = int64(d)
	}
	return out
}

func durations(ns []int64) []time.Duration {
	out := make([]time.Duration, len(ns))
	for i, n := range ns {
		out[i] = time.Duration(n)
	}
	return out
}

// separateReader is a running read-probe process.
type separateReader struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   bytes.Buffer
}

// startSeparateReader starts isobench as a read-probe of container id on
// socket; it ends with stop, with ctx (killed), when isobench dies (its
// stdin closes) or after its own limit. (No Pdeathsig: it fires when the
// thread that forked exits, which a Go thread may do.)
func startSeparateReader(ctx context.Context, socket, id string) (*separateReader, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	s := &separateReader{cmd: exec.CommandContext(ctx, exe, readProbeCmd, "--socket", socket, "--id", id)}
	s.cmd.Stdout = &s.out
	s.cmd.Stderr = os.Stderr
	if s.stdin, err = s.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the separate reader: %w", err)
	}
	return s, nil
}

// stop ends the reader and adds its latencies to usage and get.
func (s *separateReader) stop(usage, get *[]time.Duration) error {
	s.stdin.Close()
	werr := s.cmd.Wait()
	var out probeOut
	if err := json.Unmarshal(s.out.Bytes(), &out); err != nil {
		return errors.Join(fmt.Errorf("separate reader's output: %w", err), werr)
	}
	*usage = append(*usage, durations(out.UsageNs)...)
	*get = append(*get, durations(out.GetNs)...)
	if out.Err != "" {
		return fmt.Errorf("separate reader: %s", out.Err)
	}
	return werr
}
