package isolator

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/isolatord/isolatord/isolator/plane"
)

// overlapDP answers Stats only once SocketStats has begun (or fails after
// a while): a Usage that read them one after the other would fail.
type overlapDP struct {
	*fakeDP
	once  sync.Once
	begun chan struct{}
}

func (o *overlapDP) SocketStats(ctx context.Context, c plane.Container) (plane.SocketStats, error) {
	o.once.Do(func() { close(o.begun) })
	return plane.SocketStats{TCPConnections: 5}, nil
}

func (o *overlapDP) Stats(ctx context.Context, c plane.Container) (plane.LinkStats, error) {
	select {
	case <-o.begun:
		return o.fakeDP.Stats(ctx, c)
	case <-time.After(10 * time.Second):
		return plane.LinkStats{}, errors.New("SocketStats did not begin while Stats ran")
	}
}

// UsageWithSockets reads the link's counters and the namespace's figures
// at the same time, and returns both.
func TestUsageReadsSocketsBesideLink(t *testing.T) {
	dp := &overlapDP{fakeDP: newFakeDP(), begun: make(chan struct{})}
	s, err := New(testConfig(t, t.TempDir()), dp)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(bg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Prepare(bg, "c1", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Isolate(bg, "c1", nsTarget(t, "c1")); err != nil {
		t.Fatal(err)
	}
	_, _, ns, err := s.UsageWithSockets(bg, "c1")
	if err != nil || ns == nil || ns.TCPConnections != 5 {
		t.Fatalf("usage: sockets %+v, err %v", ns, err)
	}
}
