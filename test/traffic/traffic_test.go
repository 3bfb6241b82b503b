package traffic

import (
	"bufio"
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

func TestTCPEcho(t *testing.T) {
	ctx := t.Context()
	s, err := ServeTCP(ctx, "127.0.0.1:0", "alpha")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, msg := range []string{"hello", "second request", ""} {
		got, err := Echo(ctx, "tcp", s.Addr().String(), msg, WithTimeout(2*time.Second))
		if err != nil {
			t.Fatalf("echo %q: %v", msg, err)
		}
		if want := "alpha " + msg; got != want {
			t.Errorf("echo %q = %q, want %q", msg, got, want)
		}
		if ReplyName(got) != "alpha" {
			t.Errorf("ReplyName(%q) = %q", got, ReplyName(got))
		}
	}
}

func TestTCPSeveralLinesOneConnection(t *testing.T) {
	s, err := ServeTCP(t.Context(), "127.0.0.1:0", "beta")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("one\r\ntwo\nthree\n")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	for _, want := range []string{"beta one\n", "beta two\n", "beta three\n"} {
		got, err := r.ReadString('\n')
		if err != nil || got != want {
			t.Fatalf("got %q, %v; want %q", got, err, want)
		}
	}
}

func TestUDPEcho(t *testing.T) {
	ctx := t.Context()
	s, err := ServeUDP(ctx, "127.0.0.1:0", "gamma")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := Echo(ctx, "udp", s.Addr().String(), "ping me", WithTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if got != "gamma ping me" {
		t.Errorf("got %q", got)
	}
}

func TestEchoTimesOutWithoutServer(t *testing.T) {
	// A UDP socket that never answers: Echo must give up after the timeout.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	start := time.Now()
	_, err = Echo(t.Context(), "udp", pc.LocalAddr().String(), "x", WithTimeout(300*time.Millisecond))
	if err == nil {
		t.Fatal("echo to a silent socket succeeded")
	}
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Errorf("want a timeout error, got %v", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("timeout not honoured: %v", el)
	}
}

func TestEchoWithSource(t *testing.T) {
	// Two bare listeners that report the peer address, to see the bind
	// happen. Each round dials its own listener: the first connection's
	// 4-tuple may sit in TIME_WAIT on the client side (whichever side
	// closes first keeps it), and connecting the same 4-tuple again would
	// then fail with EADDRNOTAVAIL; reusing the source port for another
	// destination is what SO_REUSEADDR allows.
	peer := make(chan net.Addr, 2)
	var lns [2]net.Listener
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		lns[i] = ln
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				peer <- c.RemoteAddr()
				line, _ := bufio.NewReader(c).ReadString('\n')
				c.Write([]byte("bare " + line))
				c.Close()
			}
		}()
	}
	// Pick a free port for the source, then use it twice in a row.
	tmp, err := net.Listen("tcp", "127.0.0.7:0")
	if err != nil {
		t.Fatal(err)
	}
	src := tmp.Addr().String()
	tmp.Close()
	for i, ln := range lns {
		got, err := Echo(t.Context(), "tcp", ln.Addr().String(), "hi", WithSource(src), WithTimeout(2*time.Second))
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if got != "bare hi" {
			t.Errorf("got %q", got)
		}
		if p := (<-peer).String(); p != src {
			t.Errorf("round %d: server saw source %s, want %s", i, p, src)
		}
	}
	if _, err := Echo(t.Context(), "tcp", lns[0].Addr().String(), "hi", WithSource("198.18.99.99:0"), WithTimeout(time.Second)); err == nil {
		t.Error("binding a source address the namespace does not have succeeded")
	}
}

func TestReusePort(t *testing.T) {
	a, err := ServeTCP(t.Context(), "127.0.0.1:0", "a", WithReusePort())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := ServeTCP(t.Context(), a.Addr().String(), "b", WithReusePort())
	if err != nil {
		t.Fatalf("second SO_REUSEPORT listener on %s: %v", a.Addr(), err)
	}
	defer b.Close()
	if _, err := ServeTCP(t.Context(), a.Addr().String(), "c"); err == nil {
		t.Fatal("a listener without SO_REUSEPORT could share the port")
	}
	seen := map[string]int{}
	for i := 0; i < 64 && len(seen) < 2; i++ {
		got, err := Echo(t.Context(), "tcp", a.Addr().String(), "x", WithTimeout(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		seen[ReplyName(got)]++
	}
	if len(seen) != 2 {
		t.Errorf("64 connections all went to one listener: %v", seen)
	}
}

func TestServerStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	s, err := ServeTCP(ctx, "127.0.0.1:0", "d")
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cancel()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("open connection survived the server's context")
	}
	if _, err := net.DialTimeout("tcp", s.Addr().String(), time.Second); err == nil {
		t.Error("listener still accepts after cancel")
	}
}

func TestBenchmarkLoops(t *testing.T) {
	ctx := t.Context()
	s, err := ServeBulk(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	u, err := ServeUDP(ctx, "127.0.0.1:0", "u")
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	addr := s.Addr().String()
	d := 100 * time.Millisecond
	if r, err := RequestResponse(ctx, "tcp", addr, d); err != nil || r <= 0 {
		t.Errorf("tcp rr = %v, %v", r, err)
	}
	if r, err := RequestResponse(ctx, "udp", u.Addr().String(), d); err != nil || r <= 0 {
		t.Errorf("udp rr = %v, %v", r, err)
	}
	if r, err := ConnectRate(ctx, addr, d); err != nil || r <= 0 {
		t.Errorf("crr = %v, %v", r, err)
	}
	if r, err := Bulk(ctx, addr, d); err != nil || r <= 0 {
		t.Errorf("bulk = %v, %v", r, err)
	}
	if r, err := BulkBytes(ctx, addr, 1<<20+3); err != nil || r <= 0 {
		t.Errorf("bulk bytes = %v, %v", r, err)
	}
	// The line protocol still works on a bench server.
	if got, err := Echo(ctx, "tcp", addr, "m"); err != nil || got != "sink m" {
		t.Errorf("echo on sink = %q, %v", got, err)
	}
}

func TestPingLoopback(t *testing.T) {
	if testing.Short() {
		t.Skip("needs root (raw ICMP socket): not a unit test (-short)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: opens a raw ICMP socket")
	}
	res, err := PingStats(t.Context(), net.IPv4(127, 0, 0, 1), 3, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 3 || res.Replies != 3 || res.Duplicates != 0 || !res.ExactlyOnce() {
		t.Errorf("ping 127.0.0.1 x3: %+v, want one reply per request", res)
	}
	n, err := Ping(t.Context(), net.IPv4(127, 0, 0, 1), 1, time.Second)
	if err != nil || n != 1 {
		t.Errorf("Ping = %d, %v; want 1", n, err)
	}
}

func TestPingRejectsBadInput(t *testing.T) {
	if _, err := PingStats(t.Context(), net.IP{1, 2, 3}, 1, time.Second); err == nil || !strings.Contains(err.Error(), "not an IP address") {
		t.Errorf("3-byte dst: %v", err)
	}
	if _, err := PingStats(t.Context(), net.IPv4(127, 0, 0, 1), 0, time.Second); err == nil {
		t.Error("count 0 accepted")
	}
}

func TestPingResultTally(t *testing.T) {
	r := PingResult{Sent: 4, PerSeq: []int{1, 2, 0, 1}}.tally()
	if r.Replies != 4 || r.Answered != 3 || r.Duplicates != 1 || r.ExactlyOnce() {
		t.Errorf("tally = %+v", r)
	}
	if !(PingResult{PerSeq: []int{1, 1}}).ExactlyOnce() {
		t.Error("1,1 is exactly once")
	}
}

func TestChecksum(t *testing.T) {
	m := echoRequest(0x1234, 7)
	if Checksum(m) != 0 {
		t.Errorf("checksum over a message including its checksum = %#x, want 0", Checksum(m))
	}
}
