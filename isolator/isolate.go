package isolator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/isolatord/isolatord/isolator/plane"
)

// IsolateTarget names the container's network namespace: a pid or a path.
type IsolateTarget struct {
	Pid       int
	NetNSPath string
}

// Isolate plumbs the container's network. Repeating it with the same target
// returns the same container; another target gets AlreadyExists.
func (s *Isolator) Isolate(ctx context.Context, id string, t IsolateTarget) (Record, error) {
	r, _, _, err := s.IsolateIfLabeled(ctx, id, nil, t)
	return r, err
}

// isolateLocked is Isolate with id's lock held.
func (s *Isolator) isolateLocked(ctx context.Context, id string, t IsolateTarget) (_ Record, err error) {
	if t.Pid != 0 && t.NetNSPath != "" {
		return Record{}, errorf(ErrInvalidArgument, "target: give either pid or netns_path, not both")
	}
	if t.Pid < 0 || (t.Pid == 0 && t.NetNSPath == "") {
		return Record{}, errorf(ErrInvalidArgument, "pid: must be > 0 (or give netns_path), got %d", t.Pid)
	}

	s.mu.Lock()
	r, ok := s.records[id]
	var cur Record
	if ok {
		cur = *r
	}
	s.mu.Unlock()
	if !ok {
		return Record{}, errorf(ErrFailedPrecondition, "container_id: %s is not prepared (call Prepare first)", id)
	}
	if cur.State == StateIsolated {
		if (t.Pid != 0 && t.Pid == cur.Pid) || (t.NetNSPath != "" && t.NetNSPath == cur.NetNSPath) {
			return cur, nil
		}
		return Record{}, errorf(ErrAlreadyExists, "container_id: %s is already isolated (%s)", id, targetString(cur.Pid, cur.NetNSPath))
	}
	if cur.State != StatePrepared {
		return Record{}, errorf(ErrFailedPrecondition, "container_id: %s is %s", id, cur.State)
	}

	// Resolve the target before writing anything.
	next := cur
	if t.Pid > 0 {
		start, err := procStart(s.cfg.ProcRoot, t.Pid)
		if err != nil {
			return Record{}, errorf(ErrNotFound, "pid: process %d not found", t.Pid)
		}
		next.Pid, next.PidStart = t.Pid, start
		next.NetNSPath = fmt.Sprintf("%s/%d/ns/net", s.cfg.ProcRoot, t.Pid)
	} else {
		if _, err := os.Stat(t.NetNSPath); err != nil {
			return Record{}, errorf(ErrNotFound, "netns_path: %s: %v", t.NetNSPath, errors.Unwrap(err))
		}
		next.NetNSPath = t.NetNSPath
	}
	ino, err := s.dp.NetNSInode(next.NetNSPath)
	if err != nil {
		return Record{}, errorf(ErrNotFound, "%s: %s is not a network namespace: %v", targetField(t), next.NetNSPath, err)
	}
	next.NetNSIno = ino
	if s.Host().NetNSIno != 0 && ino == s.Host().NetNSIno {
		return Record{}, errorf(ErrFailedPrecondition, "%s: %s is the host's own network namespace", targetField(t), next.NetNSPath)
	}
	// One namespace holds one container (its eth0 is ours): claim it
	// atomically, so two concurrent Isolates into one namespace cannot both
	// pass.
	s.mu.Lock()
	if owner, ok := s.netnsOwner[ino]; ok && owner != id {
		s.mu.Unlock()
		return Record{}, errorf(ErrFailedPrecondition, "%s: network namespace %s already holds container %s", targetField(t), next.NetNSPath, owner)
	}
	s.netnsOwner[ino] = id
	s.mu.Unlock()
	next.State = StateIsolating
	next.Veth = plane.VethName(id)
	// Where the pin will be and whether it will be ours, in the intent:
	// recovery from a crash before the outcome is written must know
	// whether the pin it finds may be removed (a runtime's never may).
	if next.Mount, next.PinOwned, err = s.dp.PlanPin(s.container(&next)); err != nil {
		s.releaseNetNS(ino, id)
		return Record{}, errorf(ErrNotFound, "%s: %s: %v", targetField(t), next.NetNSPath, err)
	}
	if err := s.intend(&next); err != nil {
		s.releaseNetNS(ino, id)
		return Record{}, err
	}
	s.at("isolate:intent")

	plumb, err := s.dp.Setup(ctx, s.container(&next))
	if err != nil {
		// Setup rolled back its own work; return to prepared.
		s.releaseNetNS(ino, id)
		back := cur
		if perr := s.commit(&back); perr != nil {
			s.log.Error("persist rollback", "container_id", id, "err", perr)
		}
		if errors.Is(err, plane.ErrHostNamespace) {
			which := "the host's own network namespace"
			var rn *plane.RefusedNamespaceError
			if errors.As(err, &rn) {
				which = rn.Which
			}
			return Record{}, errorf(ErrFailedPrecondition, "%s: %s is %s, not a container's", targetField(t), next.NetNSPath, which)
		}
		return Record{}, wrapf(ErrInternal, err, "isolate %s", id)
	}
	s.at("isolate:plumbed")
	intent := next.Seq
	next.State = StateIsolated
	next.Isolated = time.Now().UTC()
	next.Veth = plumb.Veth
	next.Mount, next.PinOwned = plumb.Mount, plumb.PinOwned
	s.at("isolate:outcome")
	// The answer does not wait for the outcome's commit (isolatedStored).
	if err := s.store.PutLater(&next, func(err error) { s.isolatedStored(id, intent, err) }); err != nil {
		return Record{}, wrapf(ErrInternal, err, "persist container %s", id)
	}
	s.publish(&next)
	s.log.Info("isolated", "container_id", id, "veth", plumb.Veth, "netns", plumb.Mount, "target", targetString(next.Pid, next.NetNSPath))
	return next, nil
}

func targetString(pid int, path string) string {
	if pid > 0 {
		return "pid " + strconv.Itoa(pid)
	}
	return "netns " + path
}

func targetField(t IsolateTarget) string {
	if t.Pid > 0 {
		return "pid"
	}
	return "netns_path"
}
