// Package wait polls a condition until it holds or a deadline passes: what
// tests do instead of sleeping a fixed time and hoping the kernel, a daemon
// or a peer has caught up. A test waits for the condition it will assert
// (a counter reached, a log line printed, a capture seen) and fails with a
// message naming it when the deadline passes. Absence is proved with an
// ordered canary, not by waiting: send what must arrive after the forbidden
// packet, wait for it, then assert the forbidden one did not arrive.
//
// Tested by its own unit tests; used by the kernel and end-to-end tests.
package wait

import (
	"testing"
	"time"
)

// Interval is how often a condition is polled.
const Interval = 10 * time.Millisecond

// Until polls cond every Interval until it returns true or within has
// passed since the call, and reports whether it held. cond is called at
// least once, and once more after the deadline, so a slow first call does
// not lose the race.
func Until(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return cond()
		}
		time.Sleep(Interval)
	}
}

// For fails the test unless cond holds within the deadline; what names the
// condition in the failure ("the usage counts 64 datagrams").
func For(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Until(within, cond) {
		t.Fatalf("%s: not within %v", what, within)
	}
}
