package e2e

import (
	"strconv"
	"testing"

	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
)

// TestCNIHandoff: a rolling update of one Nomad task group on one host
// through the CNI plugin. The old alloc A holds the port (a port
// mapping); the new alloc B is added with ISOLATOR_HANDOFF_FROM=auto and
// ISOLATOR_HANDOFF_PORTS: the plugin finds A by its Nomad labels, B takes
// the new connections, A keeps its own; DEL of A leaves B alone.
func TestCNIHandoff(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{})
	nw := newCNINet(t, Binaries(t), d.Socket, "isolator", "1.1.0", "")
	ctx := cniCtx(t)
	const port = 31720
	group := [][2]string{{"NOMAD_NAMESPACE", "default"}, {"NOMAD_JOB_ID", "web"}, {"NOMAD_GROUP_NAME", "web"}}

	pa := startSharedServer(t, sb, "A", port)
	ida := sb.Name + "-A"
	rta := cniRuntime(ida, pa.NetNS, cniPortMappings(port), append(group, [2]string{"NOMAD_ALLOC_ID", "a"})...)
	if _, err := nw.CNI.AddNetworkList(ctx, nw.List, rta); err != nil {
		t.Fatalf("ADD A: %v", err)
	}
	var flows []*traffic.Flow
	for i := range 10 {
		flows = append(flows, openFlow(t, sb, port, 20000+7*i))
	}

	pb2 := startSharedServer(t, sb, "B", port)
	rtb := cniRuntime(sb.Name+"-B", pb2.NetNS, cniPortMappings(port), append(group, [2]string{"NOMAD_ALLOC_ID", "b"},
		[2]string{"ISOLATOR_HANDOFF_FROM", "auto"}, [2]string{"ISOLATOR_HANDOFF_PORTS", strconv.Itoa(port)})...)
	if _, err := nw.CNI.AddNetworkList(ctx, nw.List, rtb); err != nil {
		t.Fatalf("ADD B (handoff from A): %v\n%s", err, d.Log())
	}
	if got := newConns(sb, port, 40000, 50); got["B"] != 50 {
		t.Fatalf("new connections after B's ADD: %v, want all 50 at B", got)
	}
	for _, f := range flows {
		if got, err := f.Ask("still"); err != nil || got != "A" {
			t.Fatalf("A's connection from %d answered by %q (%v)", f.Src, got, err)
		}
	}
	if n, ok := liveFlowsOf(t, d, ida, port); !ok || n < 10 {
		t.Fatalf("A: draining %v, %d live flows", ok, n)
	}
	if err := nw.CNI.DelNetworkList(ctx, nw.List, rta); err != nil {
		t.Fatalf("DEL A: %v", err)
	}
	if got := newConns(sb, port, 41000, 20); got["B"] != 20 {
		t.Fatalf("new connections after A's DEL: %v", got)
	}
	if drainMarkers(t, sb) != 0 {
		t.Errorf("a drain marker is left after A's DEL")
	}
}
