package e2e

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/tcfilter"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

// TestDropsCounted: a frame a container may not send (here: from a source
// port it does not own) is dropped on the host side and counted by reason
// in Usage, in isolatorctl usage and in isolatord_dropped_packets_total,
// whose series all exist from zero and keep a cleaned-up container's
// counts. The counts live in the kernel: a daemon killed with SIGKILL and
// started again reports the same.
func TestDropsCounted(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{Extra: []string{"--metrics-addr", metricsAddr}})
	ctx := context.Background()

	m0 := scrape(t, sb)
	for _, r := range tcfilter.DropReasons {
		if v := value(t, m0, "isolatord_dropped_packets_total", map[string]string{"reason": r}); v != 0 {
			t.Fatalf("dropped packets (%s) at start: %v", r, v)
		}
	}

	id := sb.Name + "-d1"
	c := startServer(t, sb, "d1", 31030)
	d.Ctl(t, "prepare", id, "--ports", "31030")
	d.Ctl(t, "isolate", id, "--pid", strconv.Itoa(c.Pid))

	const n = 3
	err := c.Do(func() error {
		conn, err := net.DialUDP("udp4", &net.UDPAddr{Port: 61000}, &net.UDPAddr{IP: sb.ClientIP, Port: 9000})
		if err != nil {
			return err
		}
		defer conn.Close()
		for i := 0; i < n; i++ {
			if _, err := conn.Write([]byte("not my port")); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var u *pb.UsageResponse
	wait.Until(5*time.Second, func() bool {
		if u, err = d.Client.Usage(ctx, &pb.UsageRequest{ContainerId: id}); err != nil {
			t.Fatal(err)
		}
		return u.DroppedPackets["port"] >= n
	})
	if len(u.DroppedPackets) != len(tcfilter.DropReasons) || u.DroppedPackets["port"] < n {
		t.Fatalf("usage dropped_packets = %v, want every reason and port >= %d", u.DroppedPackets, n)
	}
	if out := d.Ctl(t, "usage", id); !strings.Contains(out, "Refused by the host:") || !strings.Contains(out, "port "+strconv.Itoa(int(u.DroppedPackets["port"]))) {
		t.Errorf("isolatorctl usage does not show the drops:\n%s", out)
	}
	if v := value(t, scrape(t, sb), "isolatord_dropped_packets_total", map[string]string{"reason": "port"}); v < n {
		t.Errorf("isolatord_dropped_packets_total{reason=port} = %v, want >= %d", v, n)
	}
	want := u.DroppedPackets
	d.Kill()
	d.Start()
	if u, err = d.Client.Usage(ctx, &pb.UsageRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	for r, k := range want {
		if u.DroppedPackets[r] != k {
			t.Errorf("after kill -9 and a restart usage dropped_packets = %v, want %v", u.DroppedPackets, want)
			break
		}
	}
	if v := value(t, scrape(t, sb), "isolatord_dropped_packets_total", map[string]string{"reason": "port"}); v < n {
		t.Errorf("after the restart isolatord_dropped_packets_total{reason=port} = %v, want >= %d", v, n)
	}
	d.Ctl(t, "cleanup", id)
	if v := value(t, scrape(t, sb), "isolatord_dropped_packets_total", map[string]string{"reason": "port"}); v < n {
		t.Errorf("after cleanup isolatord_dropped_packets_total{reason=port} = %v, want >= %d (kept)", v, n)
	}
}

// TestIsolateMachineNamespaceRefused: the daemon runs its host side in the
// sandbox (under nsenter); its own process's namespace and pid 1's (the
// machine's) are refused before anything is plumbed, naming the field.
func TestIsolateMachineNamespaceRefused(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{})
	pids := []int{d.Pid()}
	if f, err := os.Open("/proc/1/ns/net"); err != nil {
		t.Logf("pid 1's namespace cannot be opened here (%v): only the daemon's own is tried", err)
	} else {
		f.Close()
		pids = append(pids, 1)
	}
	for _, pid := range pids {
		id := sb.Name + "-root" + strconv.Itoa(pid)
		d.Ctl(t, "prepare", id)
		_, stderr, err := d.CtlResult("isolate", id, "--pid", strconv.Itoa(pid))
		if err == nil {
			t.Fatalf("isolating pid %d succeeded", pid)
		}
		if !strings.Contains(stderr, "FailedPrecondition") || !strings.Contains(stderr, "pid") {
			t.Fatalf("isolate --pid %d: %s", pid, stderr)
		}
		t.Logf("isolate --pid %d: %s", pid, strings.TrimSpace(stderr))
		if out := d.Ctl(t, "get", id); !strings.Contains(out, "PREPARED") && !strings.Contains(out, "prepared") {
			t.Errorf("state after a refused isolate:\n%s", out)
		}
	}
}
