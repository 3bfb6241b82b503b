package dataplane

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/nspin"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
)

// TestTwoContainersTraffic proves every traffic path with real TCP, UDP and
// ICMP between the outside world (client), the host namespace and two
// containers that share the host's IP and own different ports.
func TestTwoContainersTraffic(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	// A also listens on 8000, a port it does not own: connections to 8000
	// must still reach the host's listener, from outside and from A itself.
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000, 31001, 31009, 8000)
	b := e.start("B", 2, "41984-43007", "31010-31019", "", 31010)
	serveIn(t, e.sb.Host, "0.0.0.0:8000", "host")
	serveIn(t, e.sb.Client, clientAddr(9000), "client")

	for _, nw := range []string{"tcp", "udp"} {
		t.Run("client-to-container/"+nw, func(t *testing.T) {
			mustEcho(t, e.sb.Client, nw, hostAddr(31000), "A")
			mustEcho(t, e.sb.Client, nw, hostAddr(31009), "A")
			mustEcho(t, e.sb.Client, nw, hostAddr(31010), "B")
		})
		t.Run("container-to-client/"+nw, func(t *testing.T) {
			mustEcho(t, a.proc, nw, clientAddr(9000), "client")
			mustEcho(t, b.proc, nw, clientAddr(9000), "client")
		})
		t.Run("host-to-container/"+nw, func(t *testing.T) {
			mustEcho(t, e.sb.Host, nw, hostAddr(31000), "A")
			mustEcho(t, e.sb.Host, nw, loAddr(31001), "A")
			mustEcho(t, e.sb.Host, nw, hostAddr(31010), "B")
			mustEcho(t, e.sb.Host, nw, loAddr(31010), "B")
		})
		t.Run("container-to-host/"+nw, func(t *testing.T) {
			mustEcho(t, a.proc, nw, hostAddr(8000), "host")
			mustEcho(t, a.proc, nw, loAddr(8000), "host")
			mustEcho(t, b.proc, nw, hostAddr(8000), "host")
			mustEcho(t, b.proc, nw, loAddr(8000), "host")
		})
		t.Run("container-to-container/"+nw, func(t *testing.T) {
			mustEcho(t, a.proc, nw, hostAddr(31010), "B")
			mustEcho(t, a.proc, nw, loAddr(31010), "B")
			mustEcho(t, b.proc, nw, hostAddr(31000), "A")
			mustEcho(t, b.proc, nw, loAddr(31009), "A")
		})
		t.Run("container-to-itself/"+nw, func(t *testing.T) {
			mustEcho(t, a.proc, nw, hostAddr(31000), "A")
			mustEcho(t, a.proc, nw, loAddr(31001), "A")
		})
		t.Run("unowned-port-reaches-host/"+nw, func(t *testing.T) {
			mustEcho(t, e.sb.Client, nw, hostAddr(8000), "host")
		})
	}

	t.Run("bulk-tcp-host-to-container-over-lo", func(t *testing.T) {
		// 4 MB through lo -> veth: GSO segments of lo's 64K MTU must pass
		// the veth (and the container's replies use its lo MTU).
		err := e.sb.Host.Do(func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err := traffic.BulkBytes(ctx, loAddr(31000), 4<<20)
			return err
		})
		if err != nil {
			t.Error(err)
		}
		err = a.proc.Do(func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			// and a container -> other container bulk transfer via the host IP
			_, err := traffic.BulkBytes(ctx, hostAddr(31010), 4<<20)
			return err
		})
		if err != nil {
			t.Error(err)
		}
	})

	t.Run("source-port-outside-ranges-fails", func(t *testing.T) {
		for _, nw := range []string{"tcp", "udp"} {
			// a port nobody owns, a port of B, and a port of the host's range
			for _, src := range []string{"198.18.0.1:50000", "198.18.0.1:31015", "198.18.0.1:61500"} {
				if got, err := echo(a.proc, nw, clientAddr(9000), traffic.WithSource(src), traffic.WithTimeout(700*time.Millisecond)); err == nil {
					t.Errorf("%s from %s reached %s: the container is not confined to its ports", nw, src, got)
				}
			}
			if got, err := echo(a.proc, nw, hostAddr(8000), traffic.WithSource("198.18.0.1:50001"), traffic.WithTimeout(700*time.Millisecond)); err == nil {
				t.Errorf("%s to the host from port 50001 answered by %s", nw, got)
			}
			// its own static port works as a source
			mustEcho(t, a.proc, nw, clientAddr(9000), "client", traffic.WithSource("198.18.0.1:31005"))
		}
	})

	t.Run("ping", func(t *testing.T) {
		ctx := context.Background()
		for _, p := range []ctr{a, b} {
			for _, dst := range []string{"client", "host"} {
				ip := sandbox.ClientIP
				if dst == "host" {
					ip = sandbox.HostIP
				}
				var res traffic.PingResult
				err := p.proc.Do(func() (err error) {
					res, err = traffic.PingStats(ctx, ip, 3, time.Second)
					return err
				})
				if err != nil || res.Answered != 3 {
					t.Errorf("ping %s from %s: %+v %v", dst, p.c.ID, res, err)
				}
			}
		}
		var res traffic.PingResult
		err := e.sb.Client.Do(func() (err error) {
			res, err = traffic.PingStats(ctx, sandbox.HostIP, 3, time.Second)
			return err
		})
		if err != nil || !res.ExactlyOnce() {
			t.Errorf("client ping of the host IP with 2 containers: %+v %v (want exactly one reply each)", res, err)
		}
	})

	t.Run("ip-netns-exec", func(t *testing.T) {
		out, err := run(t, "ip", "netns", "exec", a.c.ID, "ss", "-ltn")
		if err != nil {
			t.Fatalf("ip netns exec %s: %v\n%s", a.c.ID, err, out)
		}
		if !strings.Contains(out, ":31000") || strings.Contains(out, ":31010") {
			t.Errorf("ss in %s does not show A's listeners:\n%s", a.c.ID, out)
		}
		ms, err := nspin.NsMounts(nspin.DefaultDir)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := ms[a.c.ID]; !ok {
			t.Errorf("no nsfs mount for %s in %s: %v", a.c.ID, nspin.DefaultDir, ms)
		}
	})

	t.Run("stats", func(t *testing.T) {
		s, err := e.d.Stats(context.Background(), a.c)
		if err != nil {
			t.Fatal(err)
		}
		if s.RxPackets == 0 || s.TxPackets == 0 || s.RxBytes < 4<<20 {
			t.Errorf("stats of A after traffic: %+v (it received 4 MB)", s)
		}
	})

	if n := e.errs.Load(); n != 0 {
		t.Errorf("%d filter operations failed", n)
	}

	t.Run("teardown-leaves-nothing", func(t *testing.T) {
		veth := plane.VethName(a.c.ID)
		rep, err := e.d.Teardown(context.Background(), a.c)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Missing) != 0 {
			t.Errorf("first teardown found missing objects: %v", rep.Missing)
		}
		if e.hasLink(veth) {
			t.Errorf("veth %s survived teardown", veth)
		}
		if f := e.hostFilters(); slotRE(1).MatchString(f) || strings.Contains(f, veth) {
			t.Errorf("host filters still reference A (slot 1 / %s):\n%s", veth, f)
		}
		for _, dm := range e.d.demuxes() {
			es, err := dm.d.Entries()
			if err != nil {
				t.Fatal(err)
			}
			for _, en := range es {
				if en.Slot == a.c.Slot {
					t.Errorf("%s demux entry of A survived teardown: %+v", dm.name, en)
				}
			}
		}
		ms, _ := nspin.NsMounts(nspin.DefaultDir)
		if _, ok := ms[a.c.ID]; ok {
			t.Errorf("mount of %s survived teardown", a.c.ID)
		}
		// A's ports now reach the host stack (nobody listens: refused), B still works.
		if got, err := echo(e.sb.Client, "tcp", hostAddr(31000)); err == nil {
			t.Errorf("A's port answered by %s after teardown", got)
		}
		mustEcho(t, e.sb.Client, "tcp", hostAddr(31010), "B")
		rep, err = e.d.Teardown(context.Background(), a.c)
		if err != nil {
			t.Fatalf("second teardown: %v", err)
		}
		if len(rep.Missing) == 0 {
			t.Error("second teardown reported nothing missing")
		}
	})
}

// slotRE matches tc's rendering of a filter tagged with slot (classid 1:slot).
func slotRE(slot uint16) *regexp.Regexp {
	return regexp.MustCompile(fmt.Sprintf(`flowid 1:%x\b`, slot))
}
