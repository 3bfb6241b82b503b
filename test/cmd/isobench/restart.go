package main

// The restart and teardown phases: SIGKILL and recovery timed, then
// every container torn down.

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
)

// phaseRestart kills SN's daemon with SIGKILL, restarts it and times its
// recovery; then checks that it kept every container and that case (c)
// still answers.
func (b *bench) phaseRestart(ctx context.Context) error {
	if b.dN == nil || b.dN.Pid() == 0 {
		return errors.New("no daemon with N containers to restart")
	}
	if err := b.dN.Stop(syscall.SIGKILL); err != nil {
		return err
	}
	// Bounded, but long enough to measure a slow recovery rather than
	// report none.
	limit := 5 * time.Minute
	if b.o.quick {
		limit = time.Minute
	}
	b.logf("killed isolatord with SIGKILL; restarting it with %d containers to recover (waiting at most %v)", b.o.n, limit)
	took, err := b.dN.Start(limit)
	if err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	cp := &b.res.ControlPlane
	cp.RecoverySeconds = ptr(took.Seconds())
	if v, ok := logField(b.dN, "recovered", "duration_seconds"); ok {
		if f, ok := v.(float64); ok {
			cp.RecoveryReportedSeconds = ptr(f)
		}
	}
	if cp.RecoveryReportedSeconds == nil {
		b.fail("restart: the daemon logged no \"recovered\" line with duration_seconds")
	}
	b.logf("restart with %d containers: serving after %.3fs", b.o.n, took.Seconds())
	b.logRecovery("restart")
	isolated, err := b.redialN(ctx)
	if err != nil {
		return fmt.Errorf("after the restart: %w", err)
	}
	cp.RecoveredContainers = ptr(isolated)
	if isolated != b.o.n {
		b.fail("restart: %d containers isolated after the restart, want %d", isolated, b.o.n)
	}
	if rss, _, err := rssBytes(b.dN); err == nil {
		cp.RSSAfterRestartMiB = ptr(float64(rss) / (1 << 20))
		b.logf("daemon RSS after the restart with %d containers: %.1f MiB", b.o.n, *cp.RSSAfterRestartMiB)
	}
	if t := b.targets[caseC]; t != nil {
		if err := echo(ctx, t); err != nil {
			b.fail("restart: case (c) after the restart: %v", err)
		}
	}
	return nil
}

// phaseTeardown cleans up every container through the API (the N in SN are
// timed) so that the cleanup path is exercised at scale too.
func (b *bench) phaseTeardown(ctx context.Context) error {
	var errs []error
	if b.cN != nil {
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		list, err := b.cN.List(lctx, &pb.ListRequest{})
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("list: %w", err))
		} else {
			var total time.Duration
			for _, c := range list.GetContainers() {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				d, err := b.teardown(ctx, b.cN, c.GetContainerId())
				if err != nil && status.Code(errors.Unwrap(err)) != codes.NotFound {
					errs = append(errs, err)
					break
				}
				total += d
			}
			if len(errs) == 0 {
				b.res.ControlPlane.TeardownAllSeconds = ptr(total.Seconds())
				b.logf("%d containers cleaned up in %.2fs of API calls", len(list.GetContainers()), total.Seconds())
			}
		}
	}
	if b.c1 != nil {
		if _, err := b.teardown(ctx, b.c1, "ctr-b"); err != nil {
			errs = append(errs, err)
		}
	}
	// The pool's namespaces (the N containers' and the cycles') are not
	// used again: freed, so that the phases after this one run with their
	// own containers' namespaces and mounts only, not a thousand more.
	if err := b.pool.removeAll(); err != nil {
		errs = append(errs, fmt.Errorf("free the namespace pool: %w", err))
	}
	return errors.Join(errs...)
}
