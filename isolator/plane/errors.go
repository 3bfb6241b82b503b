package plane

import "errors"

// ErrHostNamespace is returned by Setup when the container's namespace is the
// host's own network namespace.
var ErrHostNamespace = errors.New("the host's own network namespace")

// RefusedNamespaceError is returned (wrapping ErrHostNamespace) by Setup
// when a container's namespace is one that is never a container's.
type RefusedNamespaceError struct {
	Which string // e.g. "the network namespace of pid 1"
}

func (e *RefusedNamespaceError) Error() string { return e.Which }
func (e *RefusedNamespaceError) Unwrap() error { return ErrHostNamespace }

// ErrShaping wraps errors of bandwidth shaping (Adopt returns it when the
// container is registered but its limits could not be brought in line).
var ErrShaping = errors.New("bandwidth shaping")

// ErrNoHTB: a limit was asked but the kernel has no HTB qdisc.
var ErrNoHTB = errors.New("the kernel has no HTB qdisc (CONFIG_NET_SCH_HTB): bandwidth limits cannot be enforced")
