package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
)

// phaseRebuild kills SN's daemon with SIGKILL once more, moves its state
// file away (as if lost) and restarts it: the time until it serves is the
// rebuild of N containers from the kernel alone. It then checks that every
// container is back, isolated, and that case (c) still answers (the
// teardown phase then cleans up the rebuilt containers).
func (b *bench) phaseRebuild(ctx context.Context) error {
	if b.dN == nil || b.dN.Pid() == 0 {
		return errors.New("no daemon with N containers to restart")
	}
	if err := b.dN.Stop(syscall.SIGKILL); err != nil {
		return err
	}
	db := filepath.Join(b.tmp, "sn", "state", "isolatord.db")
	if err := os.Remove(db); err != nil {
		return fmt.Errorf("remove the state: %w", err)
	}
	limit := 5 * time.Minute
	if b.o.quick {
		limit = time.Minute
	}
	b.logf("killed isolatord with SIGKILL and removed its state; restarting it to rebuild %d containers from the kernel (waiting at most %v)", b.o.n, limit)
	took, err := b.dN.Start(limit)
	if err != nil {
		return fmt.Errorf("restart without state: %w", err)
	}
	cp := &b.res.ControlPlane
	cp.RebuildSeconds = ptr(took.Seconds())
	if v, ok := logField(b.dN, "recovered", "duration_seconds"); ok {
		if f, ok := v.(float64); ok {
			cp.RebuildReportedSeconds = ptr(f)
		}
	}
	b.logf("rebuild of %d containers from the kernel: serving after %.3fs", b.o.n, took.Seconds())
	b.logRecovery("rebuild")
	isolated, err := b.redialN(ctx)
	if err != nil {
		return fmt.Errorf("after the rebuild: %w", err)
	}
	cp.RebuiltContainers = ptr(isolated)
	if isolated < b.o.n {
		b.fail("rebuild: %d containers isolated after the rebuild, want at least %d", isolated, b.o.n)
	}
	if t := b.targets[caseC]; t != nil {
		if err := echo(ctx, t); err != nil {
			b.fail("rebuild: case (c) after the rebuild: %v", err)
		}
	}
	return nil
}

// logRecovery repeats the daemon's "recovery complete" line (its phase
// times) in the benchmark's log.
func (b *bench) logRecovery(what string) {
	for _, line := range strings.Split(b.dN.Log(), "\n") {
		if strings.Contains(line, `"msg":"recovery complete"`) {
			b.logf("%s: %s", what, line)
		}
	}
}

// redialN connects to SN's restarted daemon and counts its isolated
// containers.
func (b *bench) redialN(ctx context.Context) (int, error) {
	conn, err := b.dial(ctx, filepath.Join(b.tmp, "sn", "isolatord.sock"))
	if err != nil {
		return 0, err
	}
	b.cN = conn
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	list, err := b.cN.List(lctx, &pb.ListRequest{})
	if err != nil {
		return 0, fmt.Errorf("list: %w", err)
	}
	isolated := 0
	for _, c := range list.GetContainers() {
		if c.GetState() == pb.ContainerState_CONTAINER_STATE_ISOLATED {
			isolated++
		}
	}
	return isolated, nil
}
