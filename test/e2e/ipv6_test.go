package e2e

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestDaemonIPv6: isolatord on a host with a global IPv6 address gives
// containers IPv6 by default (one start-up log line says so), Status shows
// the host's IPv6 address, an isolated container carries it, also after a
// kill -9 and restart; with --ipv6=false containers have none. IPv6 traffic
// from the client reaches the container once the data plane steers IPv6
// (checked when the host's eth0 has ETH_P_IPV6 filters, else skipped).
func TestDaemonIPv6(t *testing.T) {
	sb := sandbox.New(t, sandbox.WithIPv6())
	d := StartDaemon(t, sb, DaemonOptions{})
	if !strings.Contains(d.Log(), "IPv6: on") {
		t.Fatalf("no start-up line saying IPv6 is on:\n%s", d.Log())
	}
	want := (&net.IPNet{IP: sb.HostIP6, Mask: net.CIDRMask(sandbox.Prefix6Len, 128)}).String()
	checkStatusIPv6(t, d, []string{want})

	id := sb.Name + "-v6"
	c := startServer(t, sb, "v6", 31001)
	d.Ctl(t, "prepare", id, "--ports", "31001")
	d.Ctl(t, "isolate", id, "--pid", strconv.Itoa(c.Pid))
	if got := containerIPv6(t, c); !slices.Contains(got, want) {
		t.Fatalf("container eth0 IPv6 addresses %v, want %s", got, want)
	}
	steered := hostSteersIPv6(t, sb)
	echo6 := func(when string) {
		t.Helper()
		if !steered {
			return
		}
		for _, nw := range []string{"tcp", "udp"} {
			if got, err := echo6FromClient(sb, nw, 31001); err != nil || got != "v6" {
				t.Errorf("%s: %s to [%s]:31001 from the client: %q, %v", when, nw, sb.HostIP6, got, err)
			}
		}
	}
	echo6("isolated")
	d.Kill()
	echo6("daemon down")
	d.Start()
	checkStatusIPv6(t, d, []string{want})
	if got := containerIPv6(t, c); !slices.Contains(got, want) {
		t.Errorf("after restart: container eth0 IPv6 addresses %v", got)
	}
	echo6("restarted")
	d.Ctl(t, "cleanup", id)

	off := sandbox.New(t, sandbox.WithIPv6())
	d2 := StartDaemon(t, off, DaemonOptions{Extra: []string{"--ipv6=false"}})
	if !strings.Contains(d2.Log(), "IPv6: off") {
		t.Errorf("no start-up line saying IPv6 is off:\n%s", d2.Log())
	}
	checkStatusIPv6(t, d2, nil)
	id2 := off.Name + "-v4"
	c2 := startServer(t, off, "v4", 31002)
	d2.Ctl(t, "prepare", id2, "--ports", "31002")
	d2.Ctl(t, "isolate", id2, "--pid", strconv.Itoa(c2.Pid))
	if got := containerIPv6(t, c2); len(got) != 0 {
		t.Errorf("--ipv6=false: container has IPv6 addresses %v", got)
	}
	mustEcho(t, off, "tcp", 31002, "v4")
	d2.Ctl(t, "cleanup", id2)
	if !steered {
		t.Log("IPv6 traffic not checked: the data plane installs no ETH_P_IPV6 filters on the host's eth0 yet")
	}
}

func checkStatusIPv6(t *testing.T, d *Daemon, want []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := d.Client.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.GetHostIpv6(), want) {
		t.Errorf("status host_ipv6 = %q, want %q", st.GetHostIpv6(), want)
	}
	out := d.Ctl(t, "status")
	line := ""
	for l := range strings.Lines(out) {
		if strings.HasPrefix(l, "Host IPv6:") {
			line = l
		}
	}
	if line == "" || (len(want) > 0 && !strings.Contains(line, want[0])) {
		t.Errorf("isolatorctl status shows no %v:\n%s", want, out)
	}
}

// containerIPv6 lists the global IPv6 addresses of c's eth0.
func containerIPv6(t *testing.T, c *sandbox.Container) []string {
	t.Helper()
	h, err := c.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range addrs {
		if a.IP.IsGlobalUnicast() {
			out = append(out, a.IPNet.String())
		}
	}
	return out
}

// hostSteersIPv6 reports whether the sandbox host's eth0 has IPv6 filters.
func hostSteersIPv6(t *testing.T, sb *sandbox.Sandbox) bool {
	t.Helper()
	h, err := sb.Host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(sb.HostEth0)
	if err != nil {
		t.Fatal(err)
	}
	fs, err := h.FilterList(l, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(fs, func(f netlink.Filter) bool { return f.Attrs().Protocol == unix.ETH_P_IPV6 })
}

func echo6FromClient(sb *sandbox.Sandbox, network string, port int) (string, error) {
	var reply string
	err := sb.Client.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		r, err := traffic.Echo(ctx, network, net.JoinHostPort(sb.HostIP6.String(), fmt.Sprint(port)), "hi", traffic.WithTimeout(2*time.Second))
		reply = r
		return err
	})
	return traffic.ReplyName(reply), err
}
