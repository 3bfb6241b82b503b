package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
)

// echoIn sends a request from the namespace of do to addr and returns the
// name of the server that answered.
func echoIn(do func(func() error) error, network, addr string) (string, error) {
	var reply string
	err := do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		r, err := traffic.Echo(ctx, network, addr, "hi", traffic.WithTimeout(time.Second))
		reply = r
		return err
	})
	return traffic.ReplyName(reply), err
}

// TestHostLoopbackPortsFlag: host services bound to 127.0.0.1 only do not
// answer a container unless their port is in --host-loopback-ports
// (status shows it); a --config reload moves the opening; the drops are
// counted as loopback in Usage. Containers keep reaching each other
// through 127.0.0.1.
func TestHostLoopbackPortsFlag(t *testing.T) {
	sb := sandbox.New(t)
	for _, x := range []struct{ addr, name string }{{"127.0.0.1:7001", "h7001"}, {"127.0.0.1:7002", "h7002"}} {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		must(t, sb.Host.Do(func() error {
			ts, err := traffic.ServeTCP(ctx, x.addr, x.name)
			if err != nil {
				return err
			}
			t.Cleanup(func() { ts.Close() })
			us, err := traffic.ServeUDP(ctx, x.addr, x.name)
			if err != nil {
				return err
			}
			t.Cleanup(func() { us.Close() })
			return nil
		}))
	}
	conf := filepath.Join(t.TempDir(), "isolatord.conf")
	must(t, os.WriteFile(conf, []byte("log-level=debug\n"), 0o600))
	d := StartDaemon(t, sb, DaemonOptions{Extra: []string{"--config", conf, "--host-loopback-ports", "7001"}})
	if out := d.Ctl(t, "status"); !strings.Contains(out, "Host loopback ports:") || !strings.Contains(out, "7001") {
		t.Errorf("status does not show the host loopback ports:\n%s", out)
	}
	id := sb.Name + "-lb"
	c := startServer(t, sb, "lb", 31050)
	d.Ctl(t, "prepare", id, "--ports", "31050")
	d.Ctl(t, "isolate", id, "--pid", strconv.Itoa(c.Pid))
	id2 := sb.Name + "-lb2"
	c2 := startServer(t, sb, "lb2", 31051)
	d.Ctl(t, "prepare", id2, "--ports", "31051")
	d.Ctl(t, "isolate", id2, "--pid", strconv.Itoa(c2.Pid))

	check := func(when string, open, closed int) {
		t.Helper()
		for _, nw := range []string{"tcp", "udp"} {
			if got, err := echoIn(c.Do, nw, "127.0.0.1:"+strconv.Itoa(open)); err != nil || got != "h"+strconv.Itoa(open) {
				t.Errorf("%s: %s 127.0.0.1:%d (opened): %q, %v", when, nw, open, got, err)
			}
			if got, err := echoIn(c.Do, nw, "127.0.0.1:"+strconv.Itoa(closed)); err == nil {
				t.Errorf("%s: %s 127.0.0.1:%d (not opened) answered %q", when, nw, closed, got)
			}
			if got, err := echoIn(c.Do, nw, "127.0.0.1:31051"); err != nil || got != "lb2" {
				t.Errorf("%s: %s to the other container through 127.0.0.1: %q, %v", when, nw, got, err)
			}
		}
	}
	check("--host-loopback-ports 7001", 7001, 7002)
	var u *pb.UsageResponse
	var err error
	if !wait.Until(5*time.Second, func() bool {
		u, err = d.Client.Usage(context.Background(), &pb.UsageRequest{ContainerId: id})
		return err == nil && u.DroppedPackets["loopback"] >= 2
	}) {
		t.Errorf("usage: loopback drops %v, %v; want >= 2", u.GetDroppedPackets(), err)
	}

	must(t, os.WriteFile(conf, []byte("log-level=debug\nhost-loopback-ports=7002\n"), 0o600))
	must(t, syscall.Kill(d.Pid(), syscall.SIGHUP))
	waitLog(t, d, `"setting":"host-loopback-ports","from":"7001","to":"7002"`)
	check("reloaded to 7002", 7002, 7001)
	if out := d.Ctl(t, "status"); !strings.Contains(out, "7002") {
		t.Errorf("status after the reload:\n%s", out)
	}
}
