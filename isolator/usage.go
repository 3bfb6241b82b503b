package isolator

import (
	"context"
	"sync"
	"time"

	"github.com/isolatord/isolatord/isolator/plane"
)

// Usage returns a container's traffic counters (zero unless it is
// isolated).
func (s *Isolator) Usage(ctx context.Context, id string) (Record, plane.LinkStats, error) {
	r, st, _, err := s.usage(ctx, id, false)
	return r, st, err
}

// UsageWithSockets is Usage with the socket and SNMP figures of the
// container's namespace, nil when it is not isolated or they cannot be
// read (the traffic counters are reported all the same).
func (s *Isolator) UsageWithSockets(ctx context.Context, id string) (Record, plane.LinkStats, *plane.SocketStats, error) {
	return s.usage(ctx, id, true)
}

// usage reads the data plane's figures of a container under its lock, so
// that they are of the container the record describes.
func (s *Isolator) usage(ctx context.Context, id string, sockets bool) (_ Record, _ plane.LinkStats, _ *plane.SocketStats, err error) {
	defer s.observe("usage", time.Now(), &err)
	if err := validateID(id); err != nil {
		return Record{}, plane.LinkStats{}, nil, err
	}
	unlock := s.locks.lock(id)
	defer unlock()
	r, ok := s.view.get(id)
	if !ok {
		return Record{}, plane.LinkStats{}, nil, errorf(ErrNotFound, "container_id: %s is not known", id)
	}
	if r.State != StateIsolated {
		return r, plane.LinkStats{}, nil, nil
	}
	c := s.container(&r)
	// The namespace's figures are read beside the link's (different
	// kernel objects, no lock in common), both before the lock is let go.
	var (
		ss   plane.SocketStats
		serr error
		wg   sync.WaitGroup
	)
	if sockets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ss, serr = s.dp.SocketStats(ctx, c)
		}()
	}
	st, err := s.dp.Stats(ctx, c)
	wg.Wait()
	if err != nil {
		return r, st, nil, wrapf(ErrInternal, err, "usage of %s", id)
	}
	if !sockets {
		return r, st, nil, nil
	}
	if serr != nil {
		s.log.Debug("usage: namespace statistics", "container_id", id, "err", serr.Error())
		return r, st, nil, nil
	}
	return r, st, &ss, nil
}
