package nsstats

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

// These tests run in the sandbox's "host" namespace, which the test creates
// and nothing else uses, so exact socket counts can be asserted. They only
// open sockets on 127.0.0.1 / ::1 inside it.

// conn is a TCP connection with both ends in the sandbox namespace.
type conn struct {
	ln             net.Listener
	client, server net.Conn
}

func (c *conn) Close() {
	for _, x := range []interface{ Close() error }{c.client, c.server, c.ln} {
		if x != nil {
			x.Close()
		}
	}
}

// connect opens, inside ns, a listener on listenNet/listenAddr and a client
// connection to it over dialNet, and exchanges a few lines so both ends
// have RTT samples.
func connect(t *testing.T, ns sandbox.NS, listenNet, listenAddr, dialNet, dialAddr string) *conn {
	t.Helper()
	c := &conn{}
	t.Cleanup(c.Close)
	err := ns.Do(func() error {
		var err error
		if c.ln, err = net.Listen(listenNet, listenAddr); err != nil {
			return err
		}
		_, port, _ := net.SplitHostPort(c.ln.Addr().String())
		d := net.Dialer{Timeout: 5 * time.Second}
		if c.client, err = d.Dial(dialNet, net.JoinHostPort(dialAddr, port)); err != nil {
			return err
		}
		c.ln.(interface{ SetDeadline(time.Time) error }).SetDeadline(time.Now().Add(5 * time.Second))
		c.server, err = c.ln.Accept()
		return err
	})
	if err != nil {
		t.Fatalf("connect in %s: %v", ns.Name, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	c.client.SetDeadline(deadline)
	c.server.SetDeadline(deadline)
	sr, cr := bufio.NewReader(c.server), bufio.NewReader(c.client)
	for i := 0; i < 5; i++ {
		if _, err := fmt.Fprintf(c.client, "ping %d\n", i); err != nil {
			t.Fatal(err)
		}
		line, err := sr.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.server.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
		if _, err := cr.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func collect(t *testing.T, path string) Stats {
	t.Helper()
	st, err := Collect(path)
	if err != nil {
		t.Fatalf("Collect(%s): %v", path, err)
	}
	return st
}

// waitFor collects until ok holds, for at most 5 seconds.
func waitFor(t *testing.T, path, what string, ok func(Stats) bool) Stats {
	t.Helper()
	var st Stats
	if !wait.Until(5*time.Second, func() bool { st = collect(t, path); return ok(st) }) {
		t.Fatalf("%s: not reached within 5s; last %+v", what, st)
	}
	return st
}

// nsIno identifies the namespace at path (a /proc ns link or a bind mount)
// by the device and inode of its nsfs file.
func nsIno(t *testing.T, path string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}

func TestCollectInNamespace(t *testing.T) {
	s := sandbox.New(t) // skips unless root
	own := nsIno(t, "/proc/self/ns/net")
	if own == nsIno(t, s.Host.Path) {
		t.Fatal("sandbox namespace is the test's own")
	}

	before := collect(t, s.Host.Path)
	if before.TCPActive != 0 || before.TCPTimeWait != 0 || before.TCPListening != 0 || before.RTT != nil {
		t.Fatalf("fresh namespace: %+v (reading the wrong namespace?)", before)
	}
	for _, g := range []string{"Ip", "Icmp", "Tcp", "Udp"} {
		if len(before.SNMP[g]) < 8 {
			t.Errorf("SNMP %s: only %d counters: %v", g, len(before.SNMP[g]), before.SNMP[g])
		}
	}

	c := connect(t, s.Host, "tcp4", "127.0.0.1:0", "tcp4", "127.0.0.1")
	during := collect(t, s.Host.Path)
	// "inuse" counts the listener and both ends of the connection.
	if during.TCPActive != 3 || during.TCPListening != 1 || during.Connections() != 2 {
		t.Errorf("one connection: TCPActive %d (want 3), TCPListening %d (want 1), Connections %d (want 2)",
			during.TCPActive, during.TCPListening, during.Connections())
	}
	if during.RTT == nil {
		t.Fatalf("no RTT with a live connection: %+v", during)
	}
	if r := during.RTT; r.Samples != 2 || r.P50 <= 0 || r.P90 < r.P50 || r.P95 < r.P90 || r.P99 < r.P95 || r.P99 > 5*time.Second {
		t.Errorf("RTT %+v: want 2 samples, 0 < p50 <= p90 <= p95 <= p99", *r)
	}
	tcp0, tcp1 := before.SNMP["Tcp"], during.SNMP["Tcp"]
	if tcp1["ActiveOpens"] != tcp0["ActiveOpens"]+1 || tcp1["PassiveOpens"] != tcp0["PassiveOpens"]+1 {
		t.Errorf("ActiveOpens %d -> %d, PassiveOpens %d -> %d: want +1 each",
			tcp0["ActiveOpens"], tcp1["ActiveOpens"], tcp0["PassiveOpens"], tcp1["PassiveOpens"])
	}
	if tcp1["CurrEstab"] != 2 {
		t.Errorf("CurrEstab = %d, want 2", tcp1["CurrEstab"])
	}
	if tcp1["InSegs"] <= tcp0["InSegs"] || during.SNMP["Ip"]["InReceives"] <= before.SNMP["Ip"]["InReceives"] {
		t.Errorf("InSegs/InReceives did not move")
	}

	// The client closes first, so its end goes to TIME_WAIT, which "inuse"
	// does not count.
	c.client.Close()
	if _, err := bufio.NewReader(c.server).ReadString('\n'); err == nil {
		t.Fatal("server read data after the client closed")
	}
	c.server.Close()
	after := waitFor(t, s.Host.Path, "client in TIME_WAIT", func(st Stats) bool {
		return st.TCPTimeWait == 1 && st.TCPActive == 1
	})
	if after.RTT != nil || after.TCPListening != 1 || after.Connections() != 0 {
		t.Errorf("after close: %+v, want no RTT, the listener alone", after)
	}
	c.ln.Close()
	waitFor(t, s.Host.Path, "listener gone", func(st Stats) bool { return st.TCPActive == 0 && st.TCPListening == 0 })

	if got := nsIno(t, "/proc/self/ns/net"); got != own {
		t.Errorf("the test process changed namespace: %s -> %s", own, got)
	}
}

// sandboxWithIPv6 is a sandbox whose namespace can listen on ::1; the test
// skips otherwise.
func sandboxWithIPv6(t *testing.T) *sandbox.Sandbox {
	t.Helper()
	s := sandbox.New(t)
	err := s.Host.Do(func() error {
		l, err := net.Listen("tcp6", "[::1]:0")
		if err == nil {
			l.Close()
		}
		return err
	})
	if err != nil {
		t.Skipf("no IPv6 loopback in the sandbox namespace: %v", err)
	}
	return s
}

// A dual-stack listener accepts IPv4 clients on AF_INET6 sockets: both the
// sockstat6 count and the AF_INET6 dump must see them.
func TestCollectDualStack(t *testing.T) {
	s := sandboxWithIPv6(t)
	connect(t, s.Host, "tcp", ":0", "tcp4", "127.0.0.1")
	st := collect(t, s.Host.Path)
	// Listener and accepted end are AF_INET6 (TCP6 inuse 2), client AF_INET.
	if st.TCPActive != 3 || st.TCPListening != 1 {
		t.Errorf("dual stack: TCPActive %d (want 3), TCPListening %d (want 1)", st.TCPActive, st.TCPListening)
	}
	if st.RTT == nil || st.RTT.Samples != 2 {
		t.Errorf("dual stack: RTT %+v, want 2 samples (one AF_INET, one AF_INET6)", st.RTT)
	}
}

// Sockets of one family alone: the other family's dump is skipped (its
// "inuse" is zero), this one's still finds them.
func TestCollectOneFamily(t *testing.T) {
	s := sandboxWithIPv6(t)
	c := connect(t, s.Host, "tcp6", "[::1]:0", "tcp6", "::1")
	st := collect(t, s.Host.Path)
	if st.TCPActive != 3 || st.TCPListening != 1 || st.RTT == nil || st.RTT.Samples != 2 {
		t.Errorf("IPv6 alone: TCPActive %d (want 3), TCPListening %d (want 1), RTT %+v (want 2 samples)", st.TCPActive, st.TCPListening, st.RTT)
	}
	c.Close()
	waitFor(t, s.Host.Path, "IPv6 sockets gone", func(st Stats) bool { return st.TCPActive == 0 && st.TCPListening == 0 })
	connect(t, s.Host, "tcp4", "127.0.0.1:0", "tcp4", "127.0.0.1")
	st = collect(t, s.Host.Path)
	if st.TCPActive != 3 || st.TCPListening != 1 || st.RTT == nil || st.RTT.Samples != 2 {
		t.Errorf("IPv4 alone: TCPActive %d (want 3), TCPListening %d (want 1), RTT %+v (want 2 samples)", st.TCPActive, st.TCPListening, st.RTT)
	}
}

// Collect from many goroutines never leaves a thread of this process in the
// sandbox namespace.
func TestCollectLeavesNoThreadBehind(t *testing.T) {
	s := sandbox.New(t)
	connect(t, s.Host, "tcp4", "127.0.0.1:0", "tcp4", "127.0.0.1")
	own := nsIno(t, "/proc/self/ns/net")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 25 && ctx.Err() == nil; i++ {
				st, err := Collect(s.Host.Path)
				if err != nil {
					errs <- err
					return
				}
				if st.TCPActive != 3 {
					errs <- fmt.Errorf("TCPActive %d, want 3", st.TCPActive)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	tasks, err := filepath.Glob("/proc/self/task/*/ns/net")
	if err != nil || len(tasks) == 0 {
		t.Fatalf("list threads: %v", err)
	}
	for _, p := range tasks {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			continue // thread gone
		}
		if l := fmt.Sprintf("%d:%d", st.Dev, st.Ino); l != own {
			t.Errorf("thread %s is in %s, not the process's namespace %s", p, l, own)
		}
	}
}

func BenchmarkCollect(b *testing.B) {
	s := sandbox.New(b)
	var (
		mu    sync.Mutex
		conns []net.Conn
		ln    net.Listener
	)
	keep := func(c net.Conn) { mu.Lock(); conns = append(conns, c); mu.Unlock() }
	err := s.Host.Do(func() error {
		var err error
		if ln, err = net.Listen("tcp4", "127.0.0.1:0"); err != nil {
			return err
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				keep(c)
			}
		}()
		for i := 0; i < 100; i++ {
			c, err := net.Dial("tcp4", ln.Addr().String())
			if err != nil {
				return err
			}
			keep(c)
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	b.ResetTimer()
	for b.Loop() {
		if _, err := Collect(s.Host.Path); err != nil {
			b.Fatal(err)
		}
	}
}
