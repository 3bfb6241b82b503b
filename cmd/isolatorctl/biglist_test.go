package main

import (
	"fmt"
	"strings"
	"testing"

	isolatordv1 "github.com/isolatord/isolatord/api/isolatord/v1"
)

// TestListThousand: `isolatorctl list` of 1,000 containers whose reply
// (labels included) is larger than the flow-control window the client
// announces, so the reply arrives in several windows.
func TestListThousand(t *testing.T) {
	sock, f := startFake(t)
	labels := map[string]string{"cni.network": "isobench", "cni.ifname": "eth0", "note": strings.Repeat("n", 2000)}
	f.mu.Lock()
	for i := 0; i < 1000; i++ {
		id := fmt.Sprintf("c%04d", i)
		f.containers[id] = &isolatordv1.Container{
			ContainerId: id, State: isolatordv1.ContainerState_CONTAINER_STATE_PREPARED,
			EphemeralPorts: &isolatordv1.EphemeralRange{Begin: 32768, End: 32769}, Labels: labels,
		}
	}
	f.mu.Unlock()
	out := mustCtl(t, sock, "list")
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 1001 || !strings.HasPrefix(lines[1], "c0000 ") || !strings.HasPrefix(lines[1000], "c0999 ") {
		t.Fatalf("list of 1,000 has %d lines (first %q, last %q)", len(lines), lines[1], lines[len(lines)-1])
	}
	list := decodeJSON[[]containerJSON](t, mustCtl(t, sock, "-o", "json", "list"))
	if len(list) != 1000 || list[999].ContainerID != "c0999" {
		t.Fatalf("list -o json: %d containers", len(list))
	}
}

// countingWriter counts the writes it is given.
type countingWriter struct {
	strings.Builder
	writes int
}

func (w *countingWriter) Write(b []byte) (int, error) {
	w.writes++
	return w.Builder.Write(b)
}

// TestListWritesBatched: the table of 1,000 containers reaches stdout in
// a few large writes, not one per cell.
func TestListWritesBatched(t *testing.T) {
	sock, f := startFake(t)
	f.mu.Lock()
	for i := 0; i < 1000; i++ {
		id := fmt.Sprintf("c%04d", i)
		f.containers[id] = &isolatordv1.Container{
			ContainerId: id, State: isolatordv1.ContainerState_CONTAINER_STATE_PREPARED,
			EphemeralPorts: &isolatordv1.EphemeralRange{Begin: 32768, End: 32769},
		}
	}
	f.mu.Unlock()
	var out countingWriter
	var errOut strings.Builder
	if code := runBuffered([]string{"--socket", sock, "list"}, &out, &errOut); code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if n := strings.Count(out.String(), "\n"); n != 1001 {
		t.Fatalf("%d lines, want 1001", n)
	}
	if out.writes > 8 {
		t.Fatalf("%d writes for %d bytes, want a few", out.writes, out.Len())
	}
}
