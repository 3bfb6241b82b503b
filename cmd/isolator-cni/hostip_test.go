package main

import (
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

// ADD asks isolatord for Status only when a port mapping names a host
// address to check: otherwise its calls are Prepare and Isolate alone.
func TestAddCallsStatusOnlyForANamedHostIP(t *testing.T) {
	e := newEnv(t)
	if err := e.plugin.Add(cmdArgs("c1", e.conf("1.1.0", twoMappings))); err != nil {
		t.Fatal(err)
	}
	if got := e.daemon.callLog(); got != "Attach c1" {
		t.Errorf("ADD without hostIP called %q, want Attach only", got)
	}

	named := `,"runtimeConfig":{"portMappings":[{"hostPort":31003,"containerPort":31003,"hostIP":"198.18.0.1"},{"hostPort":31004,"hostIP":"0.0.0.0"}]}`
	e.daemon.resetCalls()
	if err := e.plugin.Add(cmdArgs("c2", e.conf("1.1.0", named))); err != nil {
		t.Fatal(err)
	}
	if got := e.daemon.callLog(); got != "Status; Attach c2" {
		t.Errorf("ADD with hostIP 198.18.0.1 called %q, want Status first", got)
	}

	other := `,"runtimeConfig":{"portMappings":[{"hostPort":31005,"containerPort":31005,"hostIP":"198.18.0.9"}]}`
	e.daemon.resetCalls()
	ce := cniErr(t, e.plugin.Add(cmdArgs("c3", e.conf("1.1.0", other))), types.ErrInvalidNetworkConfig)
	if !strings.Contains(ce.Msg, "hostIP 198.18.0.9 is not the host address 198.18.0.1") {
		t.Errorf("error = %q", ce.Msg)
	}
	if got := e.daemon.callLog(); got != "Status" {
		t.Errorf("refused ADD called %q, want Status only (nothing prepared)", got)
	}
}

func TestNamesHostIP(t *testing.T) {
	for ip, want := range map[string]bool{"": false, "0.0.0.0": false, "::": false, "198.18.0.1": true, "2001:db8::1": true} {
		conf := &NetConf{}
		conf.RuntimeConfig.PortMappings = []PortMapping{{HostPort: 31001}, {HostPort: 31002, HostIP: ip}}
		if got := namesHostIP(conf); got != want {
			t.Errorf("namesHostIP with hostIP %q = %v, want %v", ip, got, want)
		}
	}
}

func (f *fakeDaemon) resetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = nil
}
