package main

import (
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// Signals the daemon handles. None ends it without a log line: the stop
// signals shut it down gracefully (socket removed, plumbing left in place),
// the others are logged and otherwise ignored (SIGPIPE included: a client
// closing its end must not end the daemon).
var (
	stopSignals   = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT}
	ignoreSignals = []os.Signal{syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE}
)

// watchSignals handles the signals above until the returned function is
// called: stop runs on the first stop signal (later ones are logged);
// SIGHUP asks for a reload on reloads when there is a --config file
// (canReload), and is logged and ignored otherwise.
func watchSignals(log *slog.Logger, stop func(), canReload bool, reloads chan<- struct{}) (done func()) {
	ch := make(chan os.Signal, 8)
	signal.Notify(ch, append(append([]os.Signal{}, stopSignals...), ignoreSignals...)...)
	quit := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		stopping := false
		for {
			select {
			case <-quit:
				return
			case s := <-ch:
				switch {
				case isStop(s) && !stopping:
					stopping = true
					log.Info("signal received: shutting down", "signal", s.String())
					stop()
				case isStop(s):
					log.Info("signal received while shutting down: still finishing in-flight calls", "signal", s.String())
				case s == syscall.SIGHUP && canReload:
					log.Info("signal received: reloading the --config file (once serving)", "signal", s.String())
					select {
					case reloads <- struct{}{}:
					default: // a reload is pending already
					}
				case s == syscall.SIGHUP:
					log.Info("signal received: no --config file, nothing to reload (flags take effect at restart; container plumbing is unaffected); ignored", "signal", s.String())
				default:
					log.Info("signal received: ignored", "signal", s.String())
				}
			}
		}
	}()
	return func() {
		signal.Stop(ch)
		close(quit)
		<-finished
	}
}

func isStop(s os.Signal) bool {
	for _, x := range stopSignals {
		if s == x {
			return true
		}
	}
	return false
}
