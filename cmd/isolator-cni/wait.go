package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"
)

// DefaultDaemonWait is how long the plugin waits for isolatord to come
// back when its socket is missing or refuses connections (the daemon is
// restarting) before failing the verb; "daemonWait" in the network
// configuration changes it. Without systemd's socket unit queueing
// connections, a restart leaves that gap; a runtime that sees CHECK, STATUS
// or DEL fail in it gives up on the container (Nomad destroys the alloc's
// network on a failed CHECK and skips DEL after a failed STATUS).
const DefaultDaemonWait = 10 * time.Second

// maxDaemonWait bounds "daemonWait": runtimes time plugins out too.
const maxDaemonWait = 5 * time.Minute

// waitDuration is "daemonWait": a Go duration string ("10s", "0") or a
// number of seconds.
type waitDuration struct {
	d   time.Duration
	set bool
}

func (w *waitDuration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("daemonWait: %w", err)
		}
		w.d, w.set = d, true
	} else {
		var secs float64
		if err := json.Unmarshal(b, &secs); err != nil {
			return errors.New("daemonWait: want a duration such as \"10s\" or a number of seconds")
		}
		w.d, w.set = time.Duration(secs*float64(time.Second)), true
	}
	if w.d < 0 || w.d > maxDaemonWait {
		return fmt.Errorf("daemonWait: %v is outside 0..%v", w.d, maxDaemonWait)
	}
	return nil
}

func (w waitDuration) MarshalJSON() ([]byte, error) { return json.Marshal(w.d.String()) }

// daemonWait is how long conf's verbs wait for the daemon.
func (p *Plugin) daemonWait(conf *NetConf) time.Duration {
	if conf.DaemonWait.set {
		return conf.DaemonWait.d
	}
	return p.DaemonWait
}

// daemonDown reports whether a dial error means nobody listens on the
// socket now (missing socket, refused connection): the daemon is down or
// restarting, so waiting can help.
func daemonDown(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)
}

// connect dials isolatord, waiting up to wait (and ctx) while the daemon
// is down; other failures (permission denied) are returned at once. An
// attempt that reaches a socket nobody accepts on yet (systemd holds it
// while the daemon restarts and recovers) waits up to DialTimeout beyond
// wait for the daemon to take the connection.
func (p *Plugin) connect(ctx context.Context, socket string, wait time.Duration) (isolatordv1grpc.IsolatorClient, func() error, error) {
	deadline := time.Now().Add(wait)
	dialDeadline := deadline.Add(p.DialTimeout)
	delay := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		dctx, cancel := context.WithDeadline(ctx, dialDeadline)
		c, closeConn, err := p.Dial(dctx, socket)
		cancel()
		left := time.Until(deadline)
		if err == nil || !daemonDown(err) || left <= 0 {
			if err != nil && attempt > 1 {
				err = fmt.Errorf("%w (waited %v for isolatord to come back)", err, wait)
			}
			return c, closeConn, err
		}
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("%w (gave up waiting for isolatord: %v)", err, ctx.Err())
		case <-time.After(min(delay, left)):
		}
		delay = min(delay*2, 500*time.Millisecond)
	}
}
