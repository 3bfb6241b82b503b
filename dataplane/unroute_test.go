package dataplane

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
)

// TestConcurrentTeardownsCombined: teardowns that arrive while another one
// cuts its container's paths queue theirs, and the next to take the turn
// cuts all of them in one pass; each returns only once its own container is
// unreachable: at its return, none of its ports is answered by it (from
// outside, from the host, over lo), and a container set up at once on the
// same slot and ports gets their traffic.
func TestConcurrentTeardownsCombined(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const n = 10
	type pair struct {
		old  ctr
		next plane.Container // set up on the same slot and ports after old's teardown
		port int
		name string // of old's server; next's is "N"+name[1:]
	}
	ps := make([]pair, n)
	for i := range ps {
		port := 31500 + i
		eph := fmt.Sprintf("%d-%d", 40960+64*i, 40960+64*i+63)
		old := e.start(fmt.Sprintf("O%d", i), uint16(i+1), eph, fmt.Sprint(port), "", uint16(port))
		np := e.spawn(fmt.Sprintf("N%d", i), []uint16{uint16(port)}, false)
		next := e.spec(fmt.Sprintf("N%d", i), np, uint16(i+1), eph, fmt.Sprint(port), "")
		e.cleanupMount(next.ID)
		d := e.d
		t.Cleanup(func() { d.Teardown(context.Background(), next) })
		ps[i] = pair{old, next, port, fmt.Sprintf("O%d", i)}
	}
	for _, p := range ps {
		mustEcho(t, e.sb.Client, "tcp", hostAddr(p.port), p.name)
	}
	if t.Failed() {
		t.FailNow()
	}

	// Hold the turn: the admitted teardowns queue their requests.
	q := &e.d.unrouting
	q.turn <- struct{}{}
	passes := q.passes
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := p.name
			rep, err := e.d.Teardown(ctx, p.old.c)
			if err != nil || len(rep.Missing) != 0 {
				t.Errorf("Teardown %s: %v %v", name, rep, err)
				return
			}
			// At once: no path leads to the old container any more...
			notAnsweredBy(t, e.sb.Client, hostAddr(p.port), name)
			notAnsweredBy(t, e.sb.Host, hostAddr(p.port), name)
			notAnsweredBy(t, e.sb.Host, loAddr(p.port), name)
			// ...and the ports serve a new container on the same slot.
			if _, err := e.d.Setup(ctx, p.next); err != nil {
				t.Errorf("Setup %s after the teardown of %s: %v", p.next.ID, name, err)
				return
			}
			want, long := "N"+name[1:], traffic.WithTimeout(5*time.Second)
			mustEcho(t, e.sb.Client, "tcp", hostAddr(p.port), want, long)
			mustEcho(t, e.sb.Client, "udp", hostAddr(p.port), want, long)
			mustEcho(t, e.sb.Host, "tcp", loAddr(p.port), want, long)
		}()
	}
	queued := func() int {
		q.mu.Lock()
		defer q.mu.Unlock()
		return len(q.queue)
	}
	// Every teardown admitted (as many as maxWriters) queues behind the turn.
	k := min(n, maxWriters())
	ok := wait.Until(20*time.Second, func() bool { return queued() == k })
	got := queued()
	<-q.turn // the next teardown to take the turn does the k queued ones
	if !ok {
		wg.Wait()
		t.Fatalf("%d teardowns queued behind the turn, want %d", got, k)
	}
	wg.Wait()
	// The k queued together were cut in one pass.
	if done := q.passes - passes; done > n-k+1 {
		t.Errorf("%d passes for %d teardowns, %d of them queued together: want at most %d", done, n, k, n-k+1)
	}
}
