package main

import (
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

// TestDelReadsOnlyWhatItNeeds: DEL takes the network name, the socket and
// daemonWait from its configuration and removes the container ADD set up
// even when the rest no longer passes ADD's checks (ports listed both
// ways since, a prevResult it cannot parse, a daemonWait ADD would refuse:
// DEL waits the default then); input that is not JSON still fails it
// (code 6) without a call.
func TestDelReadsOnlyWhatItNeeds(t *testing.T) {
	e := newEnv(t)
	if err := e.plugin.Add(cmdArgs("c1", e.conf("1.1.0", twoMappings))); err != nil {
		t.Fatal(err)
	}
	edited := e.conf("1.1.0", `,"ports":"31000-31010","sharedPorts":[31005],"prevResult":{"cniVersion":"1.1.0","ips":[{"address":"not an address"}]}`)
	if _, err := parseConfig(edited); err == nil {
		t.Fatal("ADD's parser accepts the edited configuration: not a test of DEL")
	}
	if err := e.plugin.Del(cmdArgs("c1", edited)); err != nil {
		t.Fatalf("DEL with the edited configuration: %v", err)
	}
	if e.daemon.has("c1") {
		t.Fatalf("c1 still held after DEL (calls: %s)", e.daemon.callLog())
	}

	for _, bad := range []string{`"soon"`, `-1`, `"100h"`, `{}`} {
		if err := e.plugin.Add(cmdArgs("c1", e.conf("1.1.0", twoMappings))); err != nil {
			t.Fatal(err)
		}
		if err := e.plugin.Del(cmdArgs("c1", e.conf("1.1.0", `,"daemonWait":`+bad))); err != nil {
			t.Fatalf("DEL with daemonWait %s: %v", bad, err)
		}
		if e.daemon.has("c1") {
			t.Fatalf("c1 still held after DEL with daemonWait %s", bad)
		}
	}

	e = newEnv(t)
	cniErr(t, e.plugin.Del(cmdArgs("c1", []byte(`{"name":"isolator",`))), types.ErrDecodingFailure)
	if calls := e.daemon.callLog(); calls != "" {
		t.Errorf("not JSON: isolatord was called: %s", calls)
	}
	// Another network's DEL (its name) leaves this network's container.
	if err := e.plugin.Add(cmdArgs("c2", e.conf("1.1.0", twoMappings))); err != nil {
		t.Fatal(err)
	}
	other := []byte(`{"cniVersion":"1.1.0","name":"blue","type":"isolator-cni","socket":"` + e.socket + `"}`)
	if err := e.plugin.Del(cmdArgs("c2", other)); err != nil {
		t.Fatal(err)
	}
	if !e.daemon.has("c2") {
		t.Error("DEL of network blue removed network isolator's container")
	}
}
