package sandbox

import (
	"io"
	"net"
	"testing"

	"github.com/isolatord/isolatord/test/traffic"
)

// benchConn returns a TCP connection from the client namespace to a bench
// server in the host namespace, already switched into mode: the baseline
// (plain veth, no data plane) that the data plane's benchmarks compare to.
func benchConn(b *testing.B, mode byte) net.Conn {
	s := New(b)
	var srv *traffic.Server
	if err := s.Host.Do(func() (err error) {
		srv, err = traffic.ServeBulk(b.Context(), "198.18.0.1:0")
		return err
	}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Close() })
	var c net.Conn
	if err := s.Client.Do(func() (err error) {
		c, err = net.Dial("tcp", srv.Addr().String())
		return err
	}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte{mode}); err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkSandboxTCPRoundTrip: one-byte request/response, client -> host
// namespace over the sandbox veth (ns/op is the round-trip time).
func BenchmarkSandboxTCPRoundTrip(b *testing.B) {
	RequireRoot(b)
	c := benchConn(b, traffic.ModeRR)
	buf := []byte{1}
	for b.Loop() {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSandboxTCPBulk: 64 KiB writes, client -> host namespace (MB/s).
func BenchmarkSandboxTCPBulk(b *testing.B) {
	RequireRoot(b)
	c := benchConn(b, traffic.ModeBulk)
	buf := make([]byte, 64<<10)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
}
