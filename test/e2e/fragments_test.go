package e2e

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
)

// TestDaemonFragments: through the daemon, a 4,000-byte UDP datagram from
// the client reaches a container whole (its later fragments steered after
// the first), and isolatorctl status and the metrics count them.
func TestDaemonFragments(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{Extra: []string{"--metrics-addr", metricsAddr}})
	id := sb.Name + "-frag"
	c := startServer(t, sb, "frag", 31001)
	d.Ctl(t, "prepare", id, "--ports", "31001")
	d.Ctl(t, "isolate", id, "--pid", strconv.Itoa(c.Pid))
	t.Cleanup(func() { d.CtlResult("cleanup", id) })
	msg := strings.Repeat("fragment-", 450) // 4,050 bytes: 3 fragments at MTU 1,500
	var reply string
	err := sb.Client.Do(func() (err error) {
		reply, err = traffic.Echo(context.Background(), "udp", net.JoinHostPort(sandbox.HostIP.String(), "31001"), msg, traffic.WithTimeout(3*time.Second))
		return err
	})
	if err != nil || reply != "frag "+msg {
		t.Fatalf("4,050-byte datagram to the container: reply of %d bytes, %v", len(reply), err)
	}
	out := d.Ctl(t, "status")
	if !strings.Contains(out, "Fragments steered:") || strings.Contains(out, "Fragments steered:       0") {
		t.Errorf("status does not count the steered fragments:\n%s", out)
	}
	if v := value(t, scrape(t, sb), "isolatord_fragments_steered_total", map[string]string{"family": "ipv4"}); v < 2 {
		t.Errorf("isolatord_fragments_steered_total{family=ipv4} = %v, want >= 2", v)
	}
}
