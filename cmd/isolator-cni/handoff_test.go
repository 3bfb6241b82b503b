package main

import (
	"context"
	"strings"
	"testing"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
)

// TestHandoffNamedPredecessorChecked: a predecessor named by id must be of
// this network and, when the call names a Nomad namespace, of that
// namespace: a job naming another tenant's container to take its port is
// refused before anything reaches isolatord's Prepare; an id isolatord
// does not know is left to it.
func TestHandoffNamedPredecessorChecked(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c, closeConn, err := e.plugin.connect(ctx, e.socket, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer closeConn()
	port := []*pb.PortRange{{Begin: 31001, End: 31001}}
	e.daemon.put(&pb.Container{ContainerId: "mine", Ports: port,
		Labels: map[string]string{LabelNetwork: "isolator", LabelArgPrefix + "NOMAD_NAMESPACE": "team-a"}})
	e.daemon.put(&pb.Container{ContainerId: "other-net", Ports: port,
		Labels: map[string]string{LabelNetwork: "elsewhere", LabelArgPrefix + "NOMAD_NAMESPACE": "team-a"}})
	args := func(from, ns string) cniArgs {
		a := cniArgs{ArgHandoffFrom: from, ArgHandoffPorts: "31001"}
		if ns != "" {
			a["NOMAD_NAMESPACE"] = ns
		}
		return a
	}
	for _, x := range []struct {
		from, ns, refused string
	}{
		{"mine", "team-a", ""},
		{"mine", "", ""},
		{"ghost", "team-a", ""},
		{"other-net", "team-a", `of network "elsewhere", not "isolator"`},
		{"mine", "team-b", `of Nomad namespace "team-a", not "team-b"`},
	} {
		from, ports, err := handoff(ctx, c, args(x.from, x.ns), "isolator", "new")
		switch {
		case x.refused == "" && (err != nil || from != x.from || len(ports) != 1):
			t.Errorf("from %s (namespace %q): %q %v, %v; want it passed on", x.from, x.ns, from, ports, err)
		case x.refused != "" && (err == nil || !strings.Contains(err.Error(), x.refused) || !strings.Contains(err.Error(), ArgHandoffFrom)):
			t.Errorf("from %s (namespace %q): %v; want a refusal naming %s and saying %s", x.from, x.ns, err, ArgHandoffFrom, x.refused)
		}
	}
	if log := e.daemon.callLog(); strings.Contains(log, "Prepare") || strings.Contains(log, "Attach") {
		t.Errorf("calls to the daemon: %s; want only reads", log)
	}
}
