package dataplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/isolatord/isolatord/isolator/plane"
)

// TestConcurrentSetupTeardown: setups and teardowns of different containers
// run at once (their own objects are made outside the data plane's lock);
// each container then gets exactly its traffic; two setups racing for one
// slot cannot both win; Stats answers throughout; all is gone at the end.
func TestConcurrentSetupTeardown(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const n = 6
	var cs []plane.Container
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("C%d", i)
		p := e.spawn(name, []uint16{uint16(31300 + i)}, false)
		eph := fmt.Sprintf("%d-%d", 40960+64*i, 40960+64*i+63)
		c := e.spec(name, p, uint16(i+1), eph, fmt.Sprint(31300+i), "")
		cs = append(cs, c)
		e.cleanupMount(c.ID)
		d := e.d
		t.Cleanup(func() { d.Teardown(context.Background(), c) })
	}
	// A rival of C0 for slot 1, in a namespace of its own.
	rp := e.spawn("R", []uint16{31399}, false)
	rival := e.spec("R", rp, 1, "44032-44095", "31399", "")
	e.cleanupMount(rival.ID)

	all := append([]plane.Container{rival}, cs...)
	errs := make([]error, len(all))
	stop := make(chan struct{})
	statsDone := make(chan error, 1)
	go func() { // reads while the setups run: answered (found or not), never stuck
		for i := 0; ; i++ {
			select {
			case <-stop:
				statsDone <- nil
				return
			default:
			}
			if _, err := e.d.Stats(ctx, cs[i%n]); errors.Is(err, ErrClosed) {
				statsDone <- err
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for i, c := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = e.d.Setup(ctx, c)
		}()
	}
	wg.Wait()
	close(stop)
	if err := <-statsDone; err != nil {
		t.Fatal(err)
	}
	// Exactly one of C0 and the rival has slot 1.
	if (errs[0] == nil) == (errs[1] == nil) {
		t.Fatalf("two setups for slot 1: rival %v, C0 %v", errs[0], errs[1])
	}
	for i, err := range errs[2:] {
		if err != nil {
			t.Fatalf("setup of %s: %v", cs[i+1].ID, err)
		}
	}
	winner := 1 // index in all
	if errs[0] == nil {
		winner = 0
		if !errors.Is(errs[1], ErrExists) {
			t.Errorf("losing setup: %v, want ErrExists", errs[1])
		}
	} else if !errors.Is(errs[0], ErrExists) {
		t.Errorf("losing setup: %v, want ErrExists", errs[0])
	}
	for i := 1; i < n; i++ {
		mustEcho(t, e.sb.Client, "tcp", hostAddr(31300+i), fmt.Sprintf("C%d", i))
		if _, err := e.d.Stats(ctx, cs[i]); err != nil {
			t.Errorf("Stats of %s: %v", cs[i].ID, err)
		}
	}
	if winner == 0 {
		mustEcho(t, e.sb.Client, "tcp", hostAddr(31399), "R")
	} else {
		mustEcho(t, e.sb.Client, "tcp", hostAddr(31300), "C0")
	}

	live := []plane.Container{all[winner]}
	live = append(live, cs[1:]...)
	terrs := make([]error, len(live))
	for i, c := range live {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, terrs[i] = e.d.Teardown(ctx, c)
		}()
	}
	wg.Wait()
	if err := errors.Join(terrs...); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < n; i++ {
		notAnsweredBy(t, e.sb.Client, hostAddr(31300+i), fmt.Sprintf("C%d", i))
	}
	e.waitNoRetired(e.d)
	for _, c := range all {
		if e.hasLink(plane.VethName(c.ID)) {
			t.Errorf("veth of %s left", c.ID)
		}
	}
	e.d.mu.Lock()
	left := len(e.d.ctrs) + len(e.d.slots) + len(e.d.settingUp)
	e.d.mu.Unlock()
	if left != 0 {
		t.Errorf("the data plane still records %d entries after every teardown", left)
	}
}
