package dataplane

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/isolatord/isolatord/isolator/plane/rate"
	"github.com/isolatord/isolatord/netns/nspin"
	"github.com/isolatord/isolatord/test/sandbox"
)

// containerState is what Setup may leave inside a container's namespace
// that a rollback must remove: links and lo's filters (their qdisc).
func containerState(t *testing.T, p *sandbox.Container) string {
	t.Helper()
	links := p.Run(t, "ip", "-o", "link", "show")
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(links), "\n") {
		if f := strings.Fields(l); len(f) > 1 {
			names = append(names, strings.TrimSuffix(f[1], ":"))
		}
	}
	var ingress []string // lo's root qdisc comes with lo up, which stays
	for _, q := range strings.Split(p.Run(t, "tc", "qdisc", "show", "dev", "lo"), "\n") {
		if strings.Contains(q, "ingress") || strings.Contains(q, "clsact") {
			ingress = append(ingress, q)
		}
	}
	return strings.Join(names, ",") + "\n" + strings.Join(ingress, "\n")
}

// TestSetupChainsRollback fails a step of one of Setup's concurrent chains
// while the other is held in the middle of its own (it goes on only once
// the failure happened): the whole Setup is rolled back, on the host and
// inside the container, and reports the injected failure, not the other
// chain's stop.
func TestSetupChainsRollback(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	e.start("A", 1, "40960-41983", "31000-31009", "9100", 31000)
	before := e.hostState()
	p := e.spawn("R", []uint16{31020, 9100}, true)
	inside := containerState(t, p)

	cases := []struct{ fail, hold string }{
		{"host veth sysctls", "container handle"},
		{"veth filters", "container config"},
		{"host veth", "container"},
		{"limits", "container"},
		{"container handle", "veth filters"},
		{"container config", "host veth sysctls"},
		{"container", "veth filters"},
		{"container", "host veth"},
	}
	for _, tc := range cases {
		// The failing step waits until the other chain is at its held
		// step, which goes on only once the failure happened.
		reached, failed := make(chan struct{}), make(chan struct{})
		var onceReached, onceFailed sync.Once
		e.d.hook = func(s string) error {
			switch s {
			case tc.fail:
				select {
				case <-reached:
				case <-time.After(10 * time.Second):
					t.Errorf("failure at %q: the other chain never reached %q", tc.fail, tc.hold)
				}
				onceFailed.Do(func() { close(failed) })
				return errInjected
			case tc.hold:
				onceReached.Do(func() { close(reached) })
				select {
				case <-failed:
				case <-time.After(10 * time.Second):
					t.Errorf("step %q waited 10 s for the failure at %q", tc.hold, tc.fail)
				}
			}
			return nil
		}
		c := e.spec("R", p, 5, "41984-43007", "31020-31029", "9100")
		c.Egress = rate.Limit{Rate: 3_000_000}
		c.Ingress = rate.Limit{Rate: 5_000_000}
		e.cleanupMount(c.ID)
		_, err := e.d.Setup(context.Background(), c)
		e.d.hook = nil
		if !errors.Is(err, errInjected) || errors.Is(err, errAborted) {
			t.Fatalf("failure at %q while %q ran: Setup returned %v, want the injected failure alone", tc.fail, tc.hold, err)
		}
		if after := e.hostState(); after != before {
			t.Errorf("failure at %q while %q ran left host changes:\n%s", tc.fail, tc.hold, lineDiff(before, after))
		}
		if after := containerState(t, p); after != inside {
			t.Errorf("failure at %q while %q ran left changes in the container:\n%s", tc.fail, tc.hold, lineDiff(inside, after))
		}
		if _, err := os.Stat(filepath.Join(nspin.DefaultDir, c.ID)); !os.IsNotExist(err) {
			t.Errorf("failure at %q left the mount point of %s", tc.fail, c.ID)
		}
		if len(e.d.ctrs) != 1 || len(e.d.shared[9100]) != 1 {
			t.Errorf("failure at %q left index entries: %d containers, shared 9100 holders %v", tc.fail, len(e.d.ctrs), e.d.shared[9100])
		}
	}

	// The namespace can then be plumbed and carries traffic.
	c := e.spec("R", p, 5, "41984-43007", "31020-31029", "9100")
	e.setup(c)
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31020), "R")
	mustEcho(t, e.sb.Client, "udp", hostAddr(31020), "R")
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31000), "A")
}

// TestSetupChainsOverlap: one chain of Setup reaches its last step while
// the other is held in its first (both ways round), so the two really run
// concurrently; Setup then completes and the container carries traffic.
func TestSetupChainsOverlap(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	p := e.spawn("O", []uint16{31000}, false)
	for _, tc := range []struct{ hold, until string }{
		{"host veth sysctls", "container"},
		{"container handle", "host veth"},
	} {
		reached := make(chan struct{})
		var once sync.Once
		var mu sync.Mutex
		var done []string // steps in the order they ended
		e.d.hook = func(s string) error {
			switch s {
			case tc.until:
				once.Do(func() { close(reached) })
			case tc.hold:
				select {
				case <-reached:
				case <-time.After(10 * time.Second):
					return errors.New("the other chain did not reach its end while this one was held")
				}
			}
			mu.Lock()
			done = append(done, s)
			mu.Unlock()
			return nil
		}
		c := e.spec("O", p, 10, "40960-41983", "31000-31009", "")
		e.setup(c)
		e.d.hook = nil
		got := strings.Join(done, ",")
		if i, j := strings.Index(got, tc.until), strings.Index(got, tc.hold); i < 0 || j < 0 || i > j {
			t.Errorf("hold at %q: steps ended in the order %s, want %q before it", tc.hold, got, tc.until)
		}
		mustEcho(t, e.sb.Client, "tcp", hostAddr(31000), "O")
		if _, err := e.d.Teardown(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
}
