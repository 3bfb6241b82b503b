package neighsync

import (
	"errors"
	"fmt"

	"github.com/isolatord/isolatord/netns/nshandle"
)

// Recovery: a restarted daemon adopts every container before it serves.
// Serving a container's neighbour requests is not isolation (its filters
// are in force without it, and it keeps its entries while nobody serves
// it, as while the daemon was down), but opening its sockets costs a
// thread switch into its namespace and requests that take the RTNL lock:
// with 1,000 containers that was over a second before serving. AddLater
// queues it; after Release (the end of recovery: the work would compete
// with recovery's own) it is done in the background, a few containers at
// a time.

// laterWorkers is how many containers AddLater opens at once.
const laterWorkers = 2

type laterAdd struct {
	id, path, eth0 string
	ino            uint64 // the namespace's inode when it was queued
	gen            uint64 // s.pending[id] while still wanted
}

type laterAdds struct {
	queue    []laterAdd
	gen      uint64
	workers  int
	released bool
}

// AddLater is Add in the background, once Release was called: the
// namespace at path (a bind mount or /proc/PID/ns/net) is opened when its
// turn comes and must still be
// the one whose inode is ino. A Remove or an Add of id before then
// cancels it. Failures are logged and counted in
// Stats.Errors.
func (s *Syncer) AddLater(id, path, eth0 string, ino uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	l := &s.later
	l.gen++
	s.pending[id] = l.gen
	l.queue = append(l.queue, laterAdd{id: id, path: path, eth0: eth0, ino: ino, gen: l.gen})
	s.startLater()
}

// Release lets AddLater's queue be served (now and from then on).
func (s *Syncer) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.later.released = true
	s.startLater()
}

// startLater starts workers for the queue, if released (with s.mu held).
func (s *Syncer) startLater() {
	l := &s.later
	for l.released && l.workers < laterWorkers && l.workers < len(l.queue) {
		l.workers++
		s.wg.Add(1)
		go s.laterWorker()
	}
}

// Serves reports whether container id's neighbour requests are served.
func (s *Syncer) Serves(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.ctrs[id]
	return ok
}

// Pending reports how many containers AddLater has yet to serve.
func (s *Syncer) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

func (s *Syncer) laterWorker() {
	defer s.wg.Done()
	for {
		s.mu.Lock()
		l := &s.later
		if s.closed || len(l.queue) == 0 {
			l.workers--
			s.mu.Unlock()
			return
		}
		a := l.queue[0]
		l.queue = l.queue[1:]
		wanted := s.pending[a.id] == a.gen
		s.mu.Unlock()
		if wanted {
			s.addLater(a)
		}
	}
}

func (s *Syncer) addLater(a laterAdd) {
	ns, err := nshandle.Open(a.path)
	var m *member
	up := false
	if err == nil {
		if ns.Ino() != a.ino {
			err = fmt.Errorf("%s is another namespace now (net:[%d], was net:[%d])", a.path, ns.Ino(), a.ino)
		} else {
			m, up, err = s.open(a.id, ns, a.eth0, s.servesIPv6())
		}
		ns.Close()
	}
	if err == nil {
		err = s.register(m, a.gen)
	}
	if err == nil {
		if up {
			s.resyncMember(m) // requests it made before
		}
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if errors.Is(err, errCancelled) || s.pending[a.id] != a.gen || s.closed {
		return // removed meanwhile: the failure does not matter
	}
	delete(s.pending, a.id)
	s.stats.Errors++
	s.log.Warn("neighbour sync: container not served", "container", a.id, "err", err)
}
