package neighsync

import (
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Resync: what lost notifications would have said, read from the tables
// themselves. The host's entries on eth0 are read again (new, changed and
// gone ones handled as their notifications would have been); each
// container's table is read for requests still pending (INCOMPLETE
// entries) and for entries it no longer has. A container is also read so
// when it starts being served, for the requests it made before.

// countResync counts a resync after the socket (what: whose table it
// reads) overflowed.
func (s *Syncer) countResync(what string) {
	s.mu.Lock()
	s.stats.Resyncs++
	s.mu.Unlock()
	s.log.Warn("neighbour sync: notifications lost (receive buffer full); reading the tables again", "tables", what)
}

// resyncMembersAsync runs resyncMembers in the background: the reader
// goes on serving requests meanwhile (a tenant's huge table takes long to
// read). Asked again while one runs, it runs once more after it.
func (s *Syncer) resyncMembersAsync() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if s.resyncing {
		s.resyncAgain = true
		return
	}
	s.resyncing = true
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			s.resyncMembers()
			s.mu.Lock()
			again := s.resyncAgain && !s.closed
			s.resyncAgain, s.resyncing = false, again
			s.mu.Unlock()
			if !again {
				return
			}
		}
	}()
}

// resyncMembers re-reads every served container's table, one at a time
// (Add and Remove go on meanwhile), each read before taking the lock.
func (s *Syncer) resyncMembers() {
	s.mu.Lock()
	ms := make([]*member, 0, len(s.ctrs))
	for _, m := range s.ctrs {
		ms = append(ms, m)
	}
	s.mu.Unlock()
	for _, m := range ms {
		s.resyncMember(m)
	}
}

// resyncHost reads the host's entries on eth0.
func (s *Syncer) resyncHost() {
	list, err := s.host.NeighList(s.eth0, netlink.FAMILY_ALL)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.stats.Errors++
		s.log.Warn("neighbour sync: read the host's neighbours", "err", err)
		return
	}
	seen := make(map[netip.Addr]bool, len(list))
	for _, n := range list {
		if ip, ok := key(n.IP); ok {
			seen[ip] = true
		}
		s.hostUpdateLocked(netlink.NeighUpdate{Type: unix.RTM_NEWNEIGH, Neigh: n})
	}
	for ip := range s.known {
		if !seen[ip] {
			s.hostUpdateLocked(netlink.NeighUpdate{Type: unix.RTM_DELNEIGH, Neigh: netlink.Neigh{LinkIndex: s.eth0, IP: ip.AsSlice()}})
		}
	}
}

// resyncMember reads m's entries on its eth0 and sorts them out before
// taking the lock (a tenant's large table of permanent entries costs its
// reader, not every caller of the lock), then handles what matters, if m
// is still served: pending requests (INCOMPLETE), entries no longer held
// (FAILED) and entries m had that are gone.
func (s *Syncer) resyncMember(m *member) {
	s.mu.Lock()
	writes := m.writes
	had := make([]netip.Addr, 0, len(m.has))
	for ip := range m.has {
		had = append(had, ip)
	}
	s.stats.Reads++
	if m.dropped {
		s.mu.Unlock()
		return
	}
	m.reading++ // rd stays open until the read is over
	s.mu.Unlock()
	list, err := m.rd.NeighList(m.eth0, netlink.FAMILY_ALL)
	var asks []netlink.Neigh
	seen := make(map[netip.Addr]bool, len(had))
	for _, ip := range had {
		seen[ip] = false
	}
	for _, n := range list {
		if n.State&(netlink.NUD_INCOMPLETE|netlink.NUD_FAILED) != 0 {
			asks = append(asks, n)
		}
		if ip, ok := key(n.IP); ok {
			if _, was := seen[ip]; was {
				seen[ip] = true
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.endRead(m) {
		return
	}
	if s.closed || s.ctrs[m.id] != m {
		return
	}
	if err != nil {
		s.stats.Errors++
		s.log.Warn("neighbour sync: read a container's neighbours", "container", m.id, "err", err)
		return
	}
	for _, n := range asks {
		s.containerUpdateLocked(m, netlink.NeighUpdate{Type: unix.RTM_NEWNEIGH, Neigh: n})
	}
	if m.writes != writes {
		return // what it has changed since the read
	}
	for ip, held := range seen {
		if !held {
			delete(m.has, ip)
		}
	}
}

// endRead ends a read of m's table and reports whether m was dropped
// meanwhile (the last read closes its read handle) (with s.mu held).
func (s *Syncer) endRead(m *member) (dropped bool) {
	m.reading--
	if m.dropped && m.reading == 0 {
		m.rd.Close()
	}
	return m.dropped
}
