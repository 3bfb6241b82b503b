package nsstats

import (
	"errors"
	"fmt"
	"os"
)

// Collect reads the statistics of the network namespace at netnsPath (for
// example /proc/PID/ns/net or /var/run/netns/NAME). It never changes the
// namespace of the calling goroutine's thread. On error the Stats are zero.
func Collect(netnsPath string) (Stats, error) {
	var st Stats
	err := doIn(netnsPath, func() (err error) {
		st, err = collectHere()
		return err
	})
	if err != nil {
		return Stats{}, err
	}
	return st, nil
}

// procNet is where the calling thread's namespace's /proc/net files are.
const procNet = "/proc/thread-self/net"

// collectHere reads everything in the calling thread's network namespace.
// The thread must be locked.
func collectHere() (Stats, error) {
	var st Stats
	b, err := os.ReadFile(procNet + "/sockstat")
	if err != nil {
		return st, err
	}
	tcp, err := parseSockstat(b, "TCP")
	if err != nil {
		return st, fmt.Errorf("sockstat: %w", err)
	}
	st.TCPActive, st.TCPTimeWait = tcp["inuse"], tcp["tw"]
	var inuse6 uint64
	// sockstat6 is absent when IPv6 is disabled.
	if b, err := os.ReadFile(procNet + "/sockstat6"); err == nil {
		tcp6, err := parseSockstat(b, "TCP6")
		if err != nil {
			return st, fmt.Errorf("sockstat6: %w", err)
		}
		inuse6 = tcp6["inuse"]
		st.TCPActive += inuse6
	} else if !errors.Is(err, os.ErrNotExist) {
		return st, err
	}

	b, err = os.ReadFile(procNet + "/snmp")
	if err != nil {
		return st, err
	}
	if st.SNMP, err = parseSNMP(b); err != nil {
		return st, fmt.Errorf("snmp: %w", err)
	}

	// A family whose "inuse" is zero has no LISTEN or ESTABLISHED socket
	// to dump (both are hashed, so counted): its dump, a walk of the
	// host-wide hash tables, is skipped.
	d, err := diagTCP(tcp["inuse"] > 0, inuse6 > 0)
	if err != nil {
		return st, err
	}
	st.TCPListening = d.listening
	st.RTT = percentiles(d.rtts)
	return st, nil
}
