package ephemeral

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Errors from the Ledger, to test with errors.Is. Ports outside the managed
// static set wrap ErrNotManaged (shared with the Allocator).
var (
	// ErrInEphemeralPool: a static request names a port of the ephemeral
	// pool. Sharing never overrides the pool.
	ErrInEphemeralPool = errors.New("port is in the ephemeral pool")
	// ErrConflict: a requested port is held by another container in a way
	// that forbids the request. Returned as a *ConflictError.
	ErrConflict = errors.New("port conflict")
	// ErrInvalidRequest: the request itself is malformed (empty container
	// name, a port asked both exclusive and shared).
	ErrInvalidRequest = errors.New("invalid port request")
	// ErrAlreadyHolding: Reserve for a container that already holds a
	// reservation (use Update).
	ErrAlreadyHolding = errors.New("container already holds a reservation")
	// ErrUnknownContainer: Update for a container with no reservation.
	ErrUnknownContainer = errors.New("container holds no reservation")
)

// Request is the set of static ports a container asks for: Exclusive ports
// are its alone; Shared ports it is willing to share with other containers
// that also share them (their programs use SO_REUSEPORT). The two sets must
// be disjoint.
type Request struct {
	Exclusive Set `json:"exclusive"`
	Shared    Set `json:"shared"`
}

// All is every port of the request.
func (r Request) All() Set { return r.Exclusive.Union(r.Shared) }

// Empty reports whether the request names no port.
func (r Request) Empty() bool { return r.Exclusive.Empty() && r.Shared.Empty() }

// Equal reports whether r and o name the same ports in the same modes.
func (r Request) Equal(o Request) bool {
	return r.Exclusive.Equal(o.Exclusive) && r.Shared.Equal(o.Shared)
}

// Holder is one container holding a static port.
type Holder struct {
	Container string `json:"container"`
	Shared    bool   `json:"shared"`
}

// ConflictError reports a requested port that other containers hold in a way
// the request cannot join. Holders are the current holders (sorted by
// container) and Reason the explanation. errors.Is(err, ErrConflict) holds.
type ConflictError struct {
	Port    uint16
	Holders []Holder
	Reason  string
}

// Error reads e.g. "port 31001 is held exclusively by c1" or "port 31001 is
// shared by c1, c2; an exclusive request cannot take it".
func (e *ConflictError) Error() string { return e.Reason }

// Unwrap returns ErrConflict.
func (e *ConflictError) Unwrap() error { return ErrConflict }

// portError is an error with an exact message that wraps a sentinel.
type portError struct {
	msg  string
	kind error
}

func (e *portError) Error() string { return e.msg }
func (e *portError) Unwrap() error { return e.kind }

// Ledger records which containers hold which operator-managed static ports,
// exclusively or shared. Its rules are symmetric (stricter than Nomad's
// ignore_collision, which only the newcomer sets):
//
//   - a port outside the managed set is refused (ErrNotManaged), and so is a
//     port of the ephemeral pool (ErrInEphemeralPool), whatever the mode;
//   - an exclusive request for a port someone holds fails;
//   - a shared request succeeds only if every current holder shares it too.
//
// Reserve and Update are all or nothing: on error the ledger is unchanged.
// A Ledger is not safe for concurrent use; the caller locks.
type Ledger struct {
	managed   Set
	ephemeral Set
	holdings  map[string]Request
	ports     map[uint16][]Holder // holders of each held port, sorted by container
}

// NewLedger returns an empty ledger over the managed static ports, refusing
// any port of ephemeralPool.
func NewLedger(managed Set, ephemeralPool Set) *Ledger {
	return &Ledger{
		managed:   managed,
		ephemeral: ephemeralPool,
		holdings:  make(map[string]Request),
		ports:     make(map[uint16][]Holder),
	}
}

// Managed is the set of static ports the ledger manages.
func (l *Ledger) Managed() Set { return l.managed }

// Reserve gives container the ports of req. It fails, changing nothing, when
// the container already holds a reservation (ErrAlreadyHolding; use Update),
// the request is malformed (ErrInvalidRequest), names a port outside the
// managed set (ErrNotManaged) or in the ephemeral pool (ErrInEphemeralPool),
// or conflicts with another container's holding (*ConflictError). An empty
// request is recorded too, so the container can Update later.
func (l *Ledger) Reserve(container string, req Request) error {
	if _, ok := l.holdings[container]; ok {
		return fmt.Errorf("container %q: %w; use Update to change it", container, ErrAlreadyHolding)
	}
	if err := l.check(container, req); err != nil {
		return err
	}
	l.add(container, req)
	return nil
}

// Update replaces container's holding with req, atomically: the new ports
// are checked against every other container (the container's own current
// holding never conflicts with itself, so a port may switch between shared
// and exclusive when nobody else holds it), and on error nothing changes.
// It fails with ErrUnknownContainer when the container holds no reservation,
// and otherwise as Reserve does.
func (l *Ledger) Update(container string, req Request) error {
	old, ok := l.holdings[container]
	if !ok {
		return fmt.Errorf("container %q: %w; use Reserve", container, ErrUnknownContainer)
	}
	if err := l.check(container, req); err != nil {
		return err
	}
	if old.Equal(req) {
		return nil
	}
	l.remove(container, old)
	l.add(container, req)
	return nil
}

// Release drops every port container holds, and its reservation. Releasing
// an unknown container does nothing.
func (l *Ledger) Release(container string) {
	if old, ok := l.holdings[container]; ok {
		l.remove(container, old)
	}
}

// Holding returns what container holds, and whether it holds a reservation.
func (l *Ledger) Holding(container string) (Request, bool) {
	r, ok := l.holdings[container]
	return r, ok
}

// Containers lists the containers holding a reservation, sorted.
func (l *Ledger) Containers() []string {
	out := make([]string, 0, len(l.holdings))
	for c := range l.holdings {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}

// Holders lists who holds port, sorted by container (nil when nobody does).
func (l *Ledger) Holders(port uint16) []Holder { return slices.Clone(l.ports[port]) }

// Counts returns how many ports are held exclusively and how many are held
// shared (a port shared by several containers counts once).
func (l *Ledger) Counts() (exclusivePorts, sharedPorts int) {
	for _, hs := range l.ports {
		if hs[0].Shared {
			sharedPorts++
		} else {
			exclusivePorts++
		}
	}
	return exclusivePorts, sharedPorts
}

// check validates req for container against the configuration and every
// other container's holdings. It never modifies the ledger.
func (l *Ledger) check(container string, req Request) error {
	if container == "" {
		return fmt.Errorf("%w: empty container name", ErrInvalidRequest)
	}
	if both := req.Exclusive.Intersect(req.Shared); !both.Empty() {
		return fmt.Errorf("%w: port %d is requested both exclusive and shared", ErrInvalidRequest, both.rs[0].Begin)
	}
	all := req.All()
	if eph := all.Intersect(l.ephemeral); !eph.Empty() {
		return &portError{
			msg:  fmt.Sprintf("port %d is in the ephemeral pool", eph.rs[0].Begin),
			kind: ErrInEphemeralPool,
		}
	}
	if out := all.Subtract(l.managed); !out.Empty() {
		managed := l.managed.String()
		if managed == "" {
			managed = "none"
		}
		return &portError{
			msg:  fmt.Sprintf("port %d is not a managed static port (managed: %s)", out.rs[0].Begin, managed),
			kind: ErrNotManaged,
		}
	}
	// Conflicts, lowest port first. Iterate over whichever is smaller: the
	// requested ports or the held ones.
	if all.Len() <= len(l.ports) {
		for _, r := range all.rs {
			for p := int(r.Begin); p <= int(r.End); p++ {
				if err := l.conflict(container, uint16(p), req.Shared.Contains(uint16(p))); err != nil {
					return err
				}
			}
		}
		return nil
	}
	var first *ConflictError
	for p := range l.ports {
		if first != nil && p > first.Port || !all.Contains(p) {
			continue
		}
		if err := l.conflict(container, p, req.Shared.Contains(p)); err != nil {
			first = err
		}
	}
	if first != nil {
		return first
	}
	return nil
}

// conflict returns why container cannot take port in the given mode, or nil.
// The container's own current holding is ignored.
func (l *Ledger) conflict(container string, port uint16, shared bool) *ConflictError {
	hs := l.ports[port]
	nOthers, exclusive := 0, false
	for _, h := range hs {
		if h.Container != container {
			nOthers++
			exclusive = exclusive || !h.Shared
		}
	}
	if nOthers == 0 || shared && !exclusive {
		return nil // the common case allocates nothing
	}
	others := make([]Holder, 0, nOthers)
	for _, h := range hs {
		if h.Container != container {
			others = append(others, h)
		}
	}
	names := make([]string, len(others))
	for i, h := range others {
		names[i] = h.Container
	}
	e := &ConflictError{Port: port, Holders: others}
	switch {
	case exclusive:
		// Only one holder can hold a port exclusively.
		e.Reason = fmt.Sprintf("port %d is held exclusively by %s", port, strings.Join(names, ", "))
	default:
		e.Reason = fmt.Sprintf("port %d is shared by %s; an exclusive request cannot take it", port, strings.Join(names, ", "))
	}
	return e
}

func (l *Ledger) add(container string, req Request) {
	l.holdings[container] = req
	for _, r := range req.All().rs {
		for p := int(r.Begin); p <= int(r.End); p++ {
			port := uint16(p)
			h := Holder{Container: container, Shared: req.Shared.Contains(port)}
			hs := l.ports[port]
			i, _ := slices.BinarySearchFunc(hs, container, func(h Holder, c string) int { return strings.Compare(h.Container, c) })
			l.ports[port] = slices.Insert(hs, i, h)
		}
	}
}

func (l *Ledger) remove(container string, req Request) {
	delete(l.holdings, container)
	for _, r := range req.All().rs {
		for p := int(r.Begin); p <= int(r.End); p++ {
			port := uint16(p)
			hs := slices.DeleteFunc(l.ports[port], func(h Holder) bool { return h.Container == container })
			if len(hs) == 0 {
				delete(l.ports, port)
			} else {
				l.ports[port] = hs
			}
		}
	}
}
