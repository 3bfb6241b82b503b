package dataplane

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/isolatord/isolatord/isolator/plane/rate"
	"github.com/isolatord/isolatord/test/traffic"
)

// TestFortyContainersPingAtOnce: 40 containers ping the client at the same
// time (raw sockets, random identifiers in none of their ports, with
// neighbour caches flushed first); each gets exactly one reply per request,
// whether its echo requests were learned (tcfilter/echo.go) or, without
// cls_bpf, mirrored to all. Then 40 containers ping the host itself: the
// host answers each, once.
func TestFortyContainersPingAtOnce(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	const n = 40
	cs := make([]ctr, n)
	for i := range cs {
		b := 32768 + 256*i
		cs[i] = e.start(fmt.Sprintf("P%d", i), uint16(i+1), fmt.Sprintf("%d-%d", b, b+255), fmt.Sprint(30000+i), "", uint16(30000+i))
	}
	pingAllAtOnce(t, cs, "client", e.sb.ClientIP)
	pingAllAtOnce(t, cs, "host", e.sb.HostIP)
}

// pingAllAtOnce makes every container ping dst (named name) 3 times, all
// at the same time, and checks that each request got exactly one reply.
func pingAllAtOnce(t *testing.T, cs []ctr, name string, dst net.IP) {
	t.Helper()
	var wg sync.WaitGroup
	res := make([]traffic.PingResult, len(cs))
	errs := make([]error, len(cs))
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.proc.Do(func() (err error) {
				res[i], err = traffic.PingStats(context.Background(), dst, 3, 3*time.Second)
				return err
			})
		}()
	}
	wg.Wait()
	for i := range cs {
		if errs[i] != nil || !res[i].ExactlyOnce() {
			t.Errorf("container %d pinging the %s (%s): %+v (%v), want exactly one reply each", i, name, dst, res[i], errs[i])
		}
	}
}

// TestPingThroughEgressShaper: a container with an egress limit sends its
// echo requests through its shaper pair (they reach eth0 from the shaper's
// exit, registered as an origin of its veth): its ping still gets exactly
// one reply each, also after a limit is added to a running container.
func TestPingThroughEgressShaper(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	ping := func(c ctr, what string) {
		t.Helper()
		var res traffic.PingResult
		err := c.proc.Do(func() (err error) {
			res, err = traffic.PingStats(context.Background(), e.sb.ClientIP, 3, 3*time.Second)
			return err
		})
		if err != nil || !res.ExactlyOnce() {
			t.Errorf("%s: %+v (%v), want exactly one reply each", what, res, err)
		}
	}
	p := e.spawn("S", []uint16{31009}, false)
	c := e.spec("S", p, 1, "40960-41983", "31000-31009", "")
	c.Egress = rate.Limit{Rate: 2_000_000}
	e.setup(c)
	ping(ctr{c: c, proc: p}, "limited at setup")

	q := e.spawn("T", []uint16{31019}, false)
	d := e.spec("T", q, 2, "41984-43007", "31010-31019", "")
	e.setup(d)
	if err := e.d.SetLimits(context.Background(), d, rate.Limit{Rate: 2_000_000}, rate.Limit{}); err != nil {
		t.Fatal(err)
	}
	ping(ctr{c: d, proc: q}, "limited later")
}
