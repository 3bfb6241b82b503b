package traffic

import (
	"bytes"
	"net"
	"os"
	"testing"
	"time"

	"github.com/isolatord/isolatord/test/wait"
)

// TestCaptureSeesLoopback: a capture on lo sees a datagram sent to
// 127.0.0.1 after it started, and counts only frames with the marker.
func TestCaptureSeesLoopback(t *testing.T) {
	if testing.Short() {
		t.Skip("needs root (packet socket): not a unit test (-short)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: opens a packet socket")
	}
	c := StartCapture(t, nil, "lo", "lo")
	if c.Name != "lo" {
		t.Errorf("Name = %q", c.Name)
	}
	srv, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	marker := []byte("capture-marker-7f3a9c")
	conn, err := net.DialUDP("udp4", nil, srv.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write(marker); err != nil {
		t.Fatal(err)
	}
	if !c.WaitFor(marker, 5*time.Second) {
		t.Fatal("the capture never saw the datagram")
	}
	if n := c.Count([]byte("never-sent-marker-0b1d")); n != 0 {
		t.Errorf("Count of a marker never sent = %d", n)
	}
	if c.Count(marker) < 1 {
		t.Error("Count after WaitFor is 0")
	}
	// lo shows a datagram twice: sent (PACKET_OUTGOING), then received
	if !wait.Until(5*time.Second, func() bool { return c.Count(marker) == 2 }) {
		t.Fatalf("lo showed the datagram %d times, want 2 (sent, received)", c.Count(marker))
	}
	sent := 0
	for _, f := range c.Outgoing() {
		if bytes.Contains(f, marker) {
			sent++
		}
	}
	if sent != 1 {
		t.Errorf("the datagram among the frames lo sent: %d times, want 1", sent)
	}
}

func TestCaptureBadInterface(t *testing.T) {
	if testing.Short() || os.Geteuid() != 0 {
		t.Skip("needs root (packet socket)")
	}
	ft := &fatalRecorder{TB: t}
	func() {
		defer func() { recover() }()
		StartCapture(ft, nil, "no-such-dev0", "none")
	}()
	if !ft.failed {
		t.Error("StartCapture on a missing interface did not fail the test")
	}
}

// fatalRecorder records Fatalf instead of ending the test.
type fatalRecorder struct {
	testing.TB
	failed bool
}

func (f *fatalRecorder) Fatalf(string, ...any) { f.failed = true; panic("fatal") }
