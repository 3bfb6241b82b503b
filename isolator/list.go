package isolator

import (
	"context"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/isolator/plane/rate"
)

func (s *Isolator) get(id string) (Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.records[id]
	if !ok {
		return Record{}, false
	}
	return *r, true
}

// Get returns one container.
func (s *Isolator) Get(ctx context.Context, id string) (Record, error) {
	if err := validateID(id); err != nil {
		return Record{}, err
	}
	r, ok := s.view.get(id)
	if !ok {
		return Record{}, errorf(ErrNotFound, "container_id: %s is not known", id)
	}
	return r, nil
}

// List returns every container, sorted by ID.
func (s *Isolator) List(ctx context.Context) []Record {
	return s.view.all()
}

// Status describes capacities and the host.
type Status struct {
	Version                     string
	BlockSize                   int
	BlocksTotal, BlocksUsed     int
	EphemeralPool, ManagedPorts ephemeral.Set
	ExclusivePorts, SharedPorts ephemeral.Set // static ports held
	Containers                  map[State]int
	Host                        plane.HostInfo
	// Bandwidth limits of containers that ask for none.
	DefaultEgress, DefaultIngress rate.Limit
	HostPorts                     HostPortsStatus // host port reservations (hostports.go)
	// What start-up recovery left for the operator (rebuild.go).
	Unattributed, Rebuilt []string
	StateMovedAside       string
	// OrphansReclaimed counts containers cleaned up because their
	// namespace was left without process or pin (orphans.go).
	OrphansReclaimed uint64
}

// Status returns capacities, holdings and the host the data plane found.
// It takes no lock a setup or teardown holds: the holdings come from the
// records' view (view.go), the blocks in use from the allocator's count,
// the host reservations from what the ledger last published.
func (s *Isolator) Status(ctx context.Context) Status {
	st := Status{
		Version:          s.cfg.Version,
		BlockSize:        s.alloc.BlockSize(),
		BlocksTotal:      s.alloc.Total(),
		BlocksUsed:       s.alloc.Used(),
		EphemeralPool:    s.cfg.EphemeralPool,
		ManagedPorts:     s.cfg.ManagedPorts,
		Containers:       map[State]int{},
		Host:             s.Host(),
		StateMovedAside:  s.store.MovedAside(),
		OrphansReclaimed: s.orphans.n.Load(),
	}
	s.rmu.Lock()
	st.DefaultEgress, st.DefaultIngress = s.cfg.Egress, s.cfg.Ingress
	st.Unattributed, st.Rebuilt = append([]string(nil), s.unattributed...), append([]string(nil), s.rebuilt...)
	s.rmu.Unlock()
	s.view.each(func(r *Record) {
		st.Containers[r.State]++
		st.ExclusivePorts = st.ExclusivePorts.Union(r.Ports)
		st.SharedPorts = st.SharedPorts.Union(r.Shared)
	})
	st.HostPorts = s.hostPorts.status()
	return st
}
