package e2e

import (
	"strconv"
	"strings"
	"testing"

	"github.com/isolatord/isolatord/dataplane"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/test/sandbox"
)

// TestBandwidthLimitsThroughTheDaemon drives limits through isolatorctl:
// set at prepare, reported by get, kept in force across a kill -9 restart,
// changed by update, and removed with everything else at cleanup. (The
// rates themselves are measured in dataplane's TestBandwidthLimits.)
func TestBandwidthLimitsThroughTheDaemon(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{})
	id := sb.Name + "-bw"
	c := startServer(t, sb, "bw", 31030)
	d.Ctl(t, "prepare", id, "--ports", "31030", "--egress-rate-limit", "2MB/s", "--ingress-rate-limit", "16Mbit")
	d.Ctl(t, "isolate", id, "--pid", strconv.Itoa(c.Pid))

	type limits struct {
		EgressLimit *struct {
			Rate int64 `json:"rate"`
		} `json:"egress_limit"`
		IngressLimit *struct {
			Rate int64 `json:"rate"`
		} `json:"ingress_limit"`
	}
	check := func(when string, egress, ingress int64) {
		t.Helper()
		var got limits
		d.CtlJSON(t, &got, "get", id)
		if got.EgressLimit == nil || got.EgressLimit.Rate != egress || got.IngressLimit == nil || got.IngressLimit.Rate != ingress {
			t.Fatalf("%s: limits %+v %+v, want egress %d ingress %d", when, got.EgressLimit, got.IngressLimit, egress, ingress)
		}
		entry, _ := dataplane.ShaperNames(id)
		if out := sb.Host.Run(t, "ip", "-o", "link", "show"); !strings.Contains(out, entry) {
			t.Fatalf("%s: no egress shaper %s in the host namespace:\n%s", when, entry, out)
		}
		veth := plane.VethName(id)
		if out := sb.Host.Run(t, "tc", "qdisc", "show", "dev", veth); !strings.Contains(out, "htb") {
			t.Fatalf("%s: no ingress HTB on %s:\n%s", when, veth, out)
		}
	}
	check("after isolate", 2_000_000, 2_000_000)
	mustEcho(t, sb, "tcp", 31030, "bw")

	d.Kill()
	d.Start()
	check("after kill -9 and restart", 2_000_000, 2_000_000)
	mustEcho(t, sb, "tcp", 31030, "bw")

	d.Ctl(t, "update", id, "--egress-rate-limit", "4MB/s")
	check("after update", 4_000_000, 2_000_000)

	base := readHostState(t, sb, d.NetNSDir)
	d.Ctl(t, "cleanup", id)
	entry, exit := dataplane.ShaperNames(id)
	// (group default: not the retired links awaiting deletion)
	out := sb.Host.Run(t, "ip", "-o", "link", "show", "group", "default")
	if strings.Contains(out, entry) || strings.Contains(out, exit) || strings.Contains(out, plane.VethName(id)) {
		t.Fatalf("cleanup left links behind:\n%s", out)
	}
	if after := readHostState(t, sb, d.NetNSDir); after.filters >= base.filters {
		t.Fatalf("cleanup removed no filters: %d -> %d", base.filters, after.filters)
	}
}
