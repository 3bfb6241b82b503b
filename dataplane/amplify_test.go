package dataplane

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

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
	for _, dst := range []struct {
		name string
		ip   []byte
	}{{"client", e.sb.ClientIP}, {"host", e.sb.HostIP}} {
		var wg sync.WaitGroup
		res := make([]traffic.PingResult, n)
		errs := make([]error, n)
		for i, c := range cs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = c.proc.Do(func() (err error) {
					res[i], err = traffic.PingStats(context.Background(), dst.ip, 3, 3*time.Second)
					return err
				})
			}()
		}
		wg.Wait()
		for i := range cs {
			if errs[i] != nil || !res[i].ExactlyOnce() {
				t.Errorf("container %d pinging the %s: %+v (%v), want exactly one reply each", i, dst.name, res[i], errs[i])
			}
		}
	}
}
