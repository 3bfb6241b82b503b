// Package neighsync gives containers their IPv4 neighbours (and, once
// EnableIPv6 was called, their IPv6 ones: neighsync6.go) from the host's
// neighbour table, so that no ARP frame from outside is ever copied to a
// container (the host demux keeps all ARP with the host).
//
// Containers share the host's IP and MAC, so an ARP reply to a container's
// request is addressed to the host and cannot tell which container asked.
// Instead of copying every ARP frame to every container (one clone per
// container per frame), the daemon resolves for them:
//
//   - Each container's eth0 gets neigh/eth0/app_solicit=3 and
//     mcast_solicit=0: when the container needs a neighbour it has no entry
//     for, its kernel does not broadcast an ARP request but asks user space
//     (an RTM_GETNEIGH notification, the "ARP daemon" hook, repeated every
//     retrans_time, 3 times, then the entry fails and the next packet asks
//     again). The Syncer listens to those notifications (one netlink
//     socket in the host's namespace receives every served namespace's,
//     another the host's own table, each with a filter keeping only what
//     the Syncer uses, read by one goroutine: poll.go, filter.go).
//   - If the host has a valid entry (any of REACHABLE, STALE, DELAY, PROBE,
//     PERMANENT) for the address, the Syncer writes it into the container
//     as a PERMANENT entry (INCOMPLETE -> PERMANENT releases the packets the
//     container queued). Otherwise it makes the host resolve the address:
//     an RTM_NEWNEIGH with NTF_USE on host eth0 (neigh_event_send: the
//     host sends its own ARP request), and remembers who waits for it.
//   - The Syncer also listens to the host's table: when an address becomes
//     valid it is written into the containers waiting for it; when its MAC
//     changes (a gratuitous ARP, a re-resolution) it is rewritten in every
//     container that has it; when the host deletes it or marks it failed
//     it is deleted in those containers (they ask again on next use).
//
// Cost: per ARP frame from outside, nothing beyond the host's own ARP
// processing (no copies). Per container set up: two netlink sockets (not
// subscribed to anything: one writes its entries, one reads its table) in
// its namespace, its settings, one netlink
// request per entry the host has on eth0, and a read of its table if its
// eth0 was up at Add (never at AddNew). Per container, requests are served up to a budget
// (budget.go). Per new neighbour: one host
// resolution (only if the host does not know it) and one netlink request
// per container that asked; per MAC change, one request per container
// holding the entry.
// Containers' entries are permanent, so they are refreshed only from the
// host's table: a neighbour that changes its MAC without the host noticing
// (no gratuitous ARP, the host not talking to it) keeps its old MAC in the
// containers until the host's entry changes or goes.
//
// While the daemon is down, containers keep the entries they have (the
// host's entries when they were set up, the gateway, what they asked for
// since) but cannot resolve new neighbours (ARP replies never reach them).
// A restarted daemon serves them again in the background (AddLater), so
// that it serves its API without waiting for 1,000 namespaces' sockets.
// Entries pending when a container starts being served (and when
// notifications were lost) are found by reading its table (resync.go).
package neighsync

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/sysctl"
)

// ContainerSysctls are the neighbour settings of a container's eth0 named
// eth0: ask user space (3 times), never the wire. Add sets them (over
// netlink: neightbl.go).
func ContainerSysctls(eth0 string) []sysctl.Setting {
	return []sysctl.Setting{
		{Name: "net/ipv4/neigh/" + eth0 + "/app_solicit", Value: strconv.Itoa(appSolicit)},
		{Name: "net/ipv4/neigh/" + eth0 + "/mcast_solicit", Value: strconv.Itoa(mcastSolicit)},
	}
}

// key is the map key of an address: IPv4 (also when given as IPv4-mapped
// IPv6) or IPv6.
func key(ip net.IP) (netip.Addr, bool) {
	a, ok := netip.AddrFromSlice(ip)
	if !ok || !a.IsValid() {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// family is the netlink family of a key.
func family(a netip.Addr) int {
	if a.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

// Stats counts what the Syncer did.
type Stats struct {
	Asked   uint64 // container requests for a neighbour (RTM_GETNEIGH / INCOMPLETE)
	Pushed  uint64 // entries written into containers
	Deleted uint64 // entries deleted in containers
	Kicks   uint64 // host resolutions started (NTF_USE)
	Errors  uint64 // failed netlink requests
	// Refused: requests not served because the container already waits
	// for MaxWaiting addresses the host has not resolved.
	Refused uint64
	// Resyncs: times notifications were lost (the socket's receive
	// buffer was full) and the tables read again.
	Resyncs uint64
	// Throttled: requests not served because their container's requests
	// cost more of the reader's time than its budget allows (budget.go).
	Throttled uint64
	// Reads: containers' tables read (at Add, after an overflow).
	Reads uint64
}

// MaxWaiting bounds the addresses one container may wait for at a time
// (asked, not yet resolved or failed by the host). An IPv4 subnet holds a
// few hundred neighbours at most; an IPv6 one (a /64) has no such bound,
// and each address waited for is memory in the daemon and an entry in the
// host's neighbour table.
const MaxWaiting = 256

// Syncer keeps containers' neighbour entries in step with the host's.
type Syncer struct {
	host    *netlink.Handle
	hostNS  nsID // the host's namespace: never served as a container
	selfID  int32
	eth0    int
	gateway netip.Addr // every container gets it at Add (zero: none)
	onLink  *net.IPNet // the host's subnet on eth0: the only addresses the host resolves for containers
	log     *slog.Logger
	wg      sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	known   map[netip.Addr]net.HardwareAddr // host's valid entries on eth0 (both families)
	waiting map[netip.Addr]map[string]bool  // address -> containers waiting for it
	kicked  map[netip.Addr]time.Time        // address waited for -> when the host was last asked to resolve it
	v6      *ipv6Side                       // nil: IPv6 neighbours are not served (neighsync6.go)
	ctrs    map[string]*member
	byNSID  map[int32][]*member // members by their namespace's id in the host's (poll.go)
	rx      *receiver
	later   laterAdds // AddLater (later.go)
	pending map[string]uint64
	stats   Stats
	// resyncing: resyncMembersAsync's goroutine runs; resyncAgain: it is
	// to run once more.
	resyncing, resyncAgain bool
}

type member struct {
	id string
	h  *netlink.Handle // requests in the container's namespace (no subscription); keeps it alive
	// rd reads its table (resync.go): on a socket of its own, so that a
	// read of a large table (a dump holds its socket until the end) never
	// holds up a write on h, made with s.mu held.
	rd   *netlink.Handle
	nsid int32 // the namespace's id in the host's namespace
	eth0 int
	has  map[netip.Addr]net.HardwareAddr
	// waits are the addresses it waits for (a copy of its part of
	// Syncer.waiting, bounded by MaxWaiting).
	waits map[netip.Addr]bool
	// writes counts changes of has (a resync's read of the table, made
	// without the lock, tells what has lost only if none came meanwhile).
	writes uint64
	budget budget // requests it may still make now (budget.go)
	// reading counts reads of its table under way (without the lock);
	// dropped: no longer served, h to be closed by the last of them.
	reading int
	dropped bool
}

// Start subscribes to the host's neighbour table on eth0 (hostNS is the
// namespace h is opened in) and returns the running Syncer. onLink is
// eth0's address and prefix: the host resolves, for containers, only
// addresses a host process could make it resolve (on-link ones, not its
// own, not the subnet's network or broadcast address); entries the host
// has are given to containers whatever the address.
//
// Every container gets, at Add, the host's valid entries and the gateway
// (resolved by the host first if needed): traffic with them keeps flowing
// while the daemon is down; only neighbours a container meets later need
// the daemon.
func Start(hostNS *nshandle.NS, h *netlink.Handle, eth0 int, onLink net.IPNet, gateway net.IP, log *slog.Logger) (*Syncer, error) {
	if log == nil {
		log = slog.Default()
	}
	if onLink.IP.To4() == nil || onLink.Mask == nil {
		return nil, fmt.Errorf("neighbour sync: host address %v is not an IPv4 prefix", onLink)
	}
	s := &Syncer{
		host: h, hostNS: nsID{hostNS.Dev(), hostNS.Ino()}, eth0: eth0, onLink: &onLink, log: log,
		known: map[netip.Addr]net.HardwareAddr{}, waiting: map[netip.Addr]map[string]bool{}, kicked: map[netip.Addr]time.Time{}, ctrs: map[string]*member{},
		byNSID: map[int32][]*member{}, pending: map[string]uint64{},
	}
	if g, ok := key(gateway); ok && g.Is4() {
		s.gateway = g
	}
	// the host's namespace may have an id for itself: its notifications then carry it
	self, err := h.GetNetNsIdByFd(hostNS.Fd())
	if err != nil {
		return nil, fmt.Errorf("neighbour sync: the host namespace's own id: %w", err)
	}
	s.selfID = int32(self)
	if s.rx, err = newReceiver(hostNS, eth0); err != nil {
		return nil, fmt.Errorf("neighbour sync: %w", err)
	}
	if s.rx.unfiltered != nil {
		log.Warn("neighbour sync: no socket filters; a tenant churning its own neighbour entries can delay others' requests", "err", s.rx.unfiltered)
	}
	s.resyncHost() // after subscribing: nothing falls in between
	s.wg.Add(1)
	go s.loop()
	if s.gateway.IsValid() && s.resolvable(s.gateway) {
		s.mu.Lock()
		s.kick(s.gateway)
		s.mu.Unlock()
	}
	return s, nil
}

// Close stops listening and closes every container's socket. Entries in
// the kernel stay; so do the namespace ids given.
func (s *Syncer) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	for id, m := range s.ctrs {
		s.drop(m)
		delete(s.ctrs, id)
	}
	s.wakeLoop()
	s.mu.Unlock()
	s.wg.Wait()
	s.rx.close()
}

// Stats returns the counters so far.
func (s *Syncer) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Add starts serving container id (its namespace ns, its interface eth0):
// it sets the container's neighbour settings (ContainerSysctls) and serves
// its neighbour requests. Adding an id again replaces the old member. The
// Syncer keeps two netlink sockets in ns, subscribed to nothing, until
// Remove.
//
// Requests the container made before are found by reading its table
// (resync.go), unless eth0 was down when Add looked: a down
// interface has no pending request, and one made once it is up reaches
// the Syncer as a notification.
func (s *Syncer) Add(id string, ns *nshandle.NS, eth0 string) error {
	m, up, err := s.open(id, ns, eth0, s.servesIPv6())
	if err != nil {
		return err
	}
	if err := s.register(m, 0); err != nil {
		return err
	}
	if up {
		s.resyncMember(m) // requests it made before
	}
	return nil
}

// AddNew is Add for a container whose namespace the caller has just set
// up, before its processes could ask for a neighbour: its table is not
// read, even with eth0 up (a dump walks every namespace's entries, so
// each Add would cost more with every container present). A request made
// in the instant between eth0 going up and AddNew is asked again by the
// container's kernel (app_solicit times, retrans_time apart).
func (s *Syncer) AddNew(id string, ns *nshandle.NS, eth0 string) error {
	m, _, err := s.open(id, ns, eth0, s.servesIPv6())
	if err != nil {
		return err
	}
	return s.register(m, 0)
}

// nsID names a namespace (its nsfs device and inode).
type nsID struct{ dev, ino uint64 }

// open makes container id's handles (requests, reads) and settings (one
// thread switch for all) and finds its namespace's id in the host's namespace,
// giving it one if it has none. up: eth0 was up before its settings were
// made.
func (s *Syncer) open(id string, ns *nshandle.NS, eth0 string, v6 bool) (_ *member, up bool, _ error) {
	if (nsID{ns.Dev(), ns.Ino()}) == s.hostNS {
		return nil, false, fmt.Errorf("neighbour sync: container %s: %v is the host's namespace", id, ns)
	}
	m := &member{id: id, has: map[netip.Addr]net.HardwareAddr{}, waits: map[netip.Addr]bool{}, budget: newBudget(time.Now())}
	err := ns.Do(func() (err error) {
		if m.h, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
			return fmt.Errorf("netlink handle: %w", err)
		}
		if m.rd, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
			m.h.Close()
			return fmt.Errorf("netlink handle: %w", err)
		}
		l, err := m.h.LinkByName(eth0)
		if err == nil {
			m.eth0 = l.Attrs().Index
			up = l.Attrs().Flags&net.FlagUp != 0
			err = setProbes(m.eth0, v6)
		}
		if err != nil {
			m.close()
			return fmt.Errorf("%s: %w", eth0, err)
		}
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("neighbour sync: container %s: %w", id, err)
	}
	if m.nsid, err = s.peerID(ns); err != nil {
		m.close()
		return nil, false, fmt.Errorf("neighbour sync: container %s: %w", id, err)
	}
	return m, up, nil
}

// close closes m's handles, which releases its namespace.
func (m *member) close() {
	m.h.Close()
	m.rd.Close()
}

// peerID returns ns's id in the host's namespace, giving it one if none.
func (s *Syncer) peerID(ns *nshandle.NS) (int32, error) {
	for range 2 {
		id, err := s.host.GetNetNsIdByFd(ns.Fd())
		if err != nil {
			return 0, fmt.Errorf("namespace id: %w", err)
		}
		if id >= 0 {
			return int32(id), nil
		}
		// -1: the kernel picks a free id; EEXIST: given one meanwhile
		if err := s.host.SetNetNsIdByFd(ns.Fd(), -1); err != nil && !errors.Is(err, unix.EEXIST) {
			return 0, fmt.Errorf("give the namespace an id: %w", err)
		}
	}
	return 0, fmt.Errorf("%v has no id in the host's namespace", ns)
}

// errCancelled: an AddLater's container was removed or added again meanwhile.
var errCancelled = errors.New("neighbour sync: cancelled")

// register starts serving m, replacing any earlier member of its id. A
// non-zero later is the AddLater it completes: if a Remove or an Add of
// the id came since, m is dropped instead (errCancelled). Requests m makes
// from then on are heard; the caller reads m's table for earlier ones.
func (s *Syncer) register(m *member, later uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		m.close()
		return errors.New("neighbour sync: closed")
	}
	if later != 0 && s.pending[m.id] != later {
		m.close()
		return errCancelled
	}
	if err := s.rx.serve(m.eth0, true); err != nil {
		m.close()
		return err
	}
	delete(s.pending, m.id)
	if old, ok := s.ctrs[m.id]; ok {
		s.drop(old)
	}
	s.ctrs[m.id] = m
	s.byNSID[m.nsid] = append(s.byNSID[m.nsid], m)
	for ip, mac := range s.known {
		if s.serves(ip) {
			s.push(m, ip, mac)
		}
	}
	for _, g := range s.gateways() {
		if s.known[g] == nil && s.resolvable(g) {
			s.wait(m, g)
		}
	}
	return nil
}

// Remove stops serving container id and closes its sockets (releasing its
// namespace); its entries stay in its namespace. Unknown ids are ignored.
func (s *Syncer) Remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pending, id)
	m, ok := s.ctrs[id]
	if !ok {
		return
	}
	delete(s.ctrs, id)
	s.drop(m)
	for ip, w := range s.waiting {
		delete(w, id)
		if len(w) == 0 {
			delete(s.waiting, ip)
			delete(s.kicked, ip)
		}
	}
}

// drop stops serving m and closes its handles, which releases its
// namespace (with s.mu held).
func (s *Syncer) drop(m *member) {
	if err := s.rx.serve(m.eth0, false); err != nil {
		s.log.Warn("neighbour sync: socket filter", "container", m.id, "err", err)
	}
	ms := slices.DeleteFunc(s.byNSID[m.nsid], func(o *member) bool { return o == m })
	if len(ms) == 0 {
		delete(s.byNSID, m.nsid)
	} else {
		s.byNSID[m.nsid] = ms
	}
	m.dropped = true
	m.h.Close()
	if m.reading == 0 {
		m.rd.Close()
	} // else the last reader closes rd (resync.go)
}

const validStates = netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_DELAY | netlink.NUD_PROBE | netlink.NUD_PERMANENT

// hostUpdateLocked handles a notification from the host's namespace (with
// s.mu held).
func (s *Syncer) hostUpdateLocked(u netlink.NeighUpdate) {
	ip, ok := key(u.IP)
	if !ok || u.LinkIndex != s.eth0 || s.closed {
		return
	}
	valid := u.Type == unix.RTM_NEWNEIGH && u.State&validStates != 0 && len(u.HardwareAddr) == 6
	gone := u.Type == unix.RTM_DELNEIGH || u.Type == unix.RTM_NEWNEIGH && u.State&netlink.NUD_FAILED != 0
	switch {
	case valid:
		mac := append(net.HardwareAddr(nil), u.HardwareAddr...)
		s.known[ip] = mac
		for id := range s.waiting[ip] {
			if m, ok := s.ctrs[id]; ok {
				s.push(m, ip, mac)
			}
		}
		s.unwait(ip)
		for _, m := range s.ctrs {
			if old, ok := m.has[ip]; ok && old.String() != mac.String() {
				s.push(m, ip, mac)
			}
		}
	case gone:
		delete(s.known, ip)
		s.unwait(ip) // its waiters ask again on their next packet
		for _, m := range s.ctrs {
			if _, ok := m.has[ip]; ok {
				s.del(m, ip)
			}
		}
	}
}

// containerUpdateLocked handles a notification from m's namespace (with s.mu
// held).
func (s *Syncer) containerUpdateLocked(m *member, u netlink.NeighUpdate) {
	ip, ok := key(u.IP)
	if !ok || u.LinkIndex != m.eth0 || !s.serves(ip) {
		return
	}
	if s.closed || s.ctrs[m.id] != m {
		return
	}
	switch {
	case u.Type == unix.RTM_DELNEIGH:
		delete(m.has, ip)
	case u.Type == unix.RTM_GETNEIGH || u.Type == unix.RTM_NEWNEIGH && u.State&(netlink.NUD_INCOMPLETE|netlink.NUD_FAILED) != 0:
		if u.Type == unix.RTM_NEWNEIGH && u.State&netlink.NUD_FAILED != 0 {
			delete(m.has, ip)
			return // the next packet asks again
		}
		now := time.Now()
		if !m.budget.ok(now) {
			s.stats.Throttled++
			return // it asks again (app_solicit times, then on its next packet)
		}
		defer func() { m.budget.charge(time.Since(now)) }()
		s.stats.Asked++
		if mac, ok := s.known[ip]; ok {
			s.push(m, ip, mac)
			return
		}
		if !s.resolvable(ip) {
			return
		}
		s.wait(m, ip)
	}
}

// wait makes m wait for ip and the host resolve it (with s.mu held).
func (s *Syncer) wait(m *member, ip netip.Addr) {
	if !m.waits[ip] {
		if len(m.waits) >= MaxWaiting {
			s.stats.Refused++
			return
		}
		m.waits[ip] = true
	}
	w := s.waiting[ip]
	if w == nil {
		w = map[string]bool{}
		s.waiting[ip] = w
	}
	w[m.id] = true
	now := time.Now()
	if t, ok := s.kicked[ip]; ok && now.Sub(t) < kickGap {
		return // the host is resolving it: its answer serves every waiter
	}
	if !s.kick(ip) {
		s.unwait(ip) // nothing will answer: they ask again
		return
	}
	s.kicked[ip] = now
}

// kickGap is the least time between two host resolutions of an address
// containers wait for: asked again meanwhile (a container's next request,
// another container's), the host is still resolving it (a lost answer
// is made up for by the next resolution).
const kickGap = time.Second

// unwait forgets who waits for ip (with s.mu held).
func (s *Syncer) unwait(ip netip.Addr) {
	for id := range s.waiting[ip] {
		if m, ok := s.ctrs[id]; ok {
			delete(m.waits, ip)
		}
	}
	delete(s.waiting, ip)
	delete(s.kicked, ip)
}

// resolvable reports whether the host may resolve ip for a container.
func (s *Syncer) resolvable(ip netip.Addr) bool {
	if !ip.Is4() {
		return s.resolvable6(ip)
	}
	a := net.IP(ip.AsSlice())
	if !s.onLink.Contains(a) || a.Equal(s.onLink.IP.To4()) {
		return false
	}
	m := s.onLink.Mask
	if len(m) == net.IPv6len {
		m = m[12:]
	}
	ones, _ := m.Size()
	if ones >= 31 {
		return true // /31, /32: no network or broadcast address
	}
	host := binary.BigEndian.Uint32(ip.AsSlice()) &^ binary.BigEndian.Uint32(m)
	all := uint32(1)<<(32-ones) - 1
	return host != 0 && host != all
}

// push writes ip -> mac into m as a permanent entry (called with s.mu held).
func (s *Syncer) push(m *member, ip netip.Addr, mac net.HardwareAddr) {
	err := m.h.NeighSet(&netlink.Neigh{
		LinkIndex: m.eth0, Family: family(ip), State: netlink.NUD_PERMANENT,
		IP: net.IP(ip.AsSlice()), HardwareAddr: mac,
	})
	if err != nil {
		s.stats.Errors++
		s.log.Warn("neighbour sync: write entry", "container", m.id, "ip", net.IP(ip.AsSlice()), "err", err)
		return
	}
	s.stats.Pushed++
	m.has[ip] = mac
	m.writes++
}

func (s *Syncer) del(m *member, ip netip.Addr) {
	err := m.h.NeighDel(&netlink.Neigh{LinkIndex: m.eth0, Family: family(ip), IP: net.IP(ip.AsSlice())})
	delete(m.has, ip)
	m.writes++
	if err != nil && !errors.Is(err, unix.ENOENT) {
		s.stats.Errors++
		s.log.Warn("neighbour sync: delete entry", "container", m.id, "ip", net.IP(ip.AsSlice()), "err", err)
		return
	}
	s.stats.Deleted++
}

// kick makes the host resolve ip (neigh_event_send through NTF_USE) and
// reports whether it could ask.
func (s *Syncer) kick(ip netip.Addr) bool {
	err := s.host.NeighSet(&netlink.Neigh{
		LinkIndex: s.eth0, Family: family(ip), IP: net.IP(ip.AsSlice()), Flags: netlink.NTF_USE,
	})
	if err != nil {
		s.stats.Errors++
		s.log.Warn("neighbour sync: host resolution", "ip", net.IP(ip.AsSlice()), "err", err)
		return false
	}
	s.stats.Kicks++
	return true
}
