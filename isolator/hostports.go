package isolator

// Host port reservations: while a container holds a static port, the host
// namespace holds a reservation for it (hostports.Ports: bound sockets a
// host process's bind() collides with), and a port a host socket already
// holds is refused at Prepare and Update. The lifecycle counts the holders
// of each port here (a shared port is reserved once, released when its last
// holder leaves) and tells the kernel side only of first takes and last
// releases.

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
)

// HostPorts reserves ports in the host namespace. hostports.Ports
// implements it; unit tests use a fake.
type HostPorts interface {
	// Reserve takes a reservation for each port, all or none. When a host
	// socket holds one, the error has a HeldPort() uint16 method and its
	// message names the port and the holder.
	Reserve(ports ephemeral.Set) error
	// Release gives reservations back (ports not reserved are ignored).
	Release(ports ephemeral.Set)
}

// hostHeld is how Reserve's refusal is recognized.
type hostHeld interface{ HeldPort() uint16 }

// HostPortConflict is a port a container holds whose host reservation could
// not be retaken at start-up: a host process bound it while the daemon was
// down. The host process receives none of the port's traffic (the filters
// deliver it to the container).
type HostPortConflict struct {
	Port   uint16
	Holder string // what the kernel side said (port, process, socket)
}

// HostPortsStatus is what Status reports about reservations.
type HostPortsStatus struct {
	Enabled   bool // a HostPorts is configured
	Reserved  int  // ports reserved on the host
	Conflicts []HostPortConflict
}

// hostLedger counts the holders of each port. Its own mutex; the lifecycle
// may call it with s.mu held (never the other way round). The mutex is held
// across the reservations' syscalls (binding and closing sockets), so
// status reads shown, published at the end of every change, instead.
type hostLedger struct {
	shown     atomic.Pointer[HostPortsStatus]
	mu        sync.Mutex
	hp        HostPorts // nil: no reservations
	count     map[uint16]int
	held      map[string]ephemeral.Set // container -> ports it counts for
	conflicts map[uint16]string

	// the conflict watcher (watchConflicts)
	quit chan struct{}
	done chan struct{}
}

func newHostLedger(hp HostPorts) *hostLedger {
	h := &hostLedger{hp: hp, count: map[uint16]int{}, held: map[string]ephemeral.Set{}, conflicts: map[uint16]string{}}
	h.publish()
	return h
}

// grow makes id hold want on top of what it holds, reserving the ports no
// container held yet; on a refusal nothing changes.
func (h *hostLedger) grow(id string, want ephemeral.Set) error {
	if h.hp == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	defer h.publish()
	add := want.Subtract(h.held[id])
	if add.Empty() {
		return nil
	}
	var first []ephemeral.Range
	for _, p := range add.Ports() {
		if h.count[p] == 0 {
			first = append(first, ephemeral.Range{Begin: p, End: p})
		}
	}
	if err := h.hp.Reserve(ephemeral.NewSet(first...)); err != nil {
		return err
	}
	h.take(id, add)
	return nil
}

// take counts id as a holder of add; h.mu held.
func (h *hostLedger) take(id string, add ephemeral.Set) {
	for _, p := range add.Ports() {
		h.count[p]++
	}
	h.held[id] = h.held[id].Union(add)
}

// settle makes id hold only keep (of what it holds), releasing the ports
// their last holder leaves.
func (h *hostLedger) settle(id string, keep ephemeral.Set) {
	if h.hp == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	defer h.publish()
	drop := h.held[id].Subtract(keep)
	if drop.Empty() {
		return
	}
	var last []ephemeral.Range
	for _, p := range drop.Ports() {
		if h.count[p]--; h.count[p] <= 0 {
			delete(h.count, p)
			delete(h.conflicts, p)
			last = append(last, ephemeral.Range{Begin: p, End: p})
		}
	}
	h.hp.Release(ephemeral.NewSet(last...))
	if rest := h.held[id].Subtract(drop); rest.Empty() {
		delete(h.held, id)
	} else {
		h.held[id] = rest
	}
}

// retake is grow at start-up: the reservations died with the previous
// process. A port a host socket took meanwhile is counted as held (the
// container keeps it) and recorded as a conflict; other failures are
// returned after counting.
func (h *hostLedger) retake(id string, want ephemeral.Set) (conflicts []HostPortConflict, err error) {
	if h.hp == nil {
		return nil, nil
	}
	if err := h.grow(id, want); err == nil || !IsHostPortHeld(err) {
		return nil, err
	}
	// One port at a time to find every conflict.
	h.mu.Lock()
	defer h.mu.Unlock()
	defer h.publish()
	add := want.Subtract(h.held[id])
	var errs []error
	for _, p := range add.Ports() {
		if h.count[p] == 0 {
			if err := h.hp.Reserve(ephemeral.NewSet(ephemeral.Range{Begin: p, End: p})); IsHostPortHeld(err) {
				h.conflicts[p] = err.Error()
				conflicts = append(conflicts, HostPortConflict{Port: p, Holder: err.Error()})
			} else if err != nil {
				errs = append(errs, err)
			}
		}
	}
	h.take(id, add)
	return conflicts, errors.Join(errs...)
}

// DefaultHostPortsRetry is how often conflicted ports are tried again.
const DefaultHostPortsRetry = 10 * time.Second

// watchConflicts starts, when recovery found conflicts, a goroutine that
// tries to reserve the conflicted ports again every interval: once the host
// process holding one has let it go, the port is reserved (and the
// conflict cleared) before another can take it. It ends when no conflict
// is left, or at stop.
func (h *hostLedger) watchConflicts(interval time.Duration, log *slog.Logger) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.conflicts) == 0 || h.quit != nil {
		return
	}
	if interval <= 0 {
		interval = DefaultHostPortsRetry
	}
	h.quit, h.done = make(chan struct{}), make(chan struct{})
	go func(quit, done chan struct{}) {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			retaken, left := h.retryConflicts()
			for _, p := range retaken {
				log.Info("host port reserved again: the host process that held it let it go", "port", p)
			}
			if left == 0 {
				return
			}
		}
	}(h.quit, h.done)
}

// retryConflicts tries to reserve each conflicted port (still held by a
// container) again.
func (h *hostLedger) retryConflicts() (retaken []uint16, left int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	defer h.publish()
	for p := range h.conflicts {
		err := h.hp.Reserve(ephemeral.NewSet(ephemeral.Range{Begin: p, End: p}))
		switch {
		case err == nil:
			delete(h.conflicts, p)
			retaken = append(retaken, p)
		case IsHostPortHeld(err):
			h.conflicts[p] = err.Error() // the holder may have changed
		}
	}
	sort.Slice(retaken, func(i, j int) bool { return retaken[i] < retaken[j] })
	return retaken, len(h.conflicts)
}

// stop ends the conflict watcher, if any, and waits for it.
func (h *hostLedger) stop() {
	h.mu.Lock()
	quit, done := h.quit, h.done
	h.quit = nil
	h.mu.Unlock()
	if quit != nil {
		close(quit)
		<-done
	}
}

// publish makes status report the reservations as they are; h.mu held.
func (h *hostLedger) publish() {
	st := HostPortsStatus{Enabled: h.hp != nil, Reserved: len(h.count) - len(h.conflicts)}
	for p, holder := range h.conflicts {
		st.Conflicts = append(st.Conflicts, HostPortConflict{Port: p, Holder: holder})
	}
	sort.Slice(st.Conflicts, func(i, j int) bool { return st.Conflicts[i].Port < st.Conflicts[j].Port })
	h.shown.Store(&st)
}

// status reports the reservations held and the conflicts as last
// published: it never waits for a reservation in progress.
func (h *hostLedger) status() HostPortsStatus {
	st := *h.shown.Load()
	st.Conflicts = append([]HostPortConflict(nil), st.Conflicts...)
	return st
}

// IsHostPortHeld reports whether err is (or wraps) a refusal because a
// host socket holds a port.
func IsHostPortHeld(err error) bool {
	var hh hostHeld
	return errors.As(err, &hh)
}

// hostError maps a reservation failure to an API error.
func hostError(err error) error {
	if IsHostPortHeld(err) {
		return &Error{Kind: ErrFailedPrecondition, Msg: fmt.Sprintf("ports: %v", err), Err: err}
	}
	return wrapf(ErrInternal, err, "reserve host ports")
}

// hostReserve makes container id hold ports on the host as well (Prepare,
// Update: the ports it is to have, on top of what it has).
func (s *Isolator) hostReserve(id string, ports ephemeral.Set) error {
	if err := s.hostPorts.grow(id, ports); err != nil {
		return hostError(err)
	}
	return nil
}

// hostRetake retakes a recovered container's reservations and reports the
// ports host processes took while the daemon was down.
func (s *Isolator) hostRetake(r *Record, rep *RecoveryReport) {
	req := holdRequest(r)
	conflicts, err := s.hostPorts.retake(r.ID, req.Exclusive.Union(req.Shared))
	for _, c := range conflicts {
		s.log.Warn("recover: a host process took a container's port while the daemon was down; the container keeps the port's traffic, the host process gets none",
			"container_id", r.ID, "port", c.Port, "holder", c.Holder)
	}
	rep.HostPortConflicts = append(rep.HostPortConflicts, conflicts...)
	if err != nil {
		s.log.Error("recover: host port reservations not retaken", "container_id", r.ID, "err", err)
	}
}
