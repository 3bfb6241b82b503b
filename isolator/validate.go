package isolator

import (
	"errors"
	"fmt"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane"
)

// PortSpec is one requested static port range as it arrives from the API
// (uint32 so that values above 65535 are rejected, not truncated).
type PortSpec struct {
	Begin, End uint32
	Shared     bool
}

// ParsePorts validates requested ports and returns the exclusive and shared
// sets. field names the request field in error messages (e.g. "ports").
func ParsePorts(field string, specs []PortSpec) (excl, shared ephemeral.Set, err error) {
	for i, p := range specs {
		name := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case p.Begin == 0:
			return excl, shared, errorf(ErrInvalidArgument, "%s.begin: port 0 is not a valid port (1-65535)", name)
		case p.Begin > 65535:
			return excl, shared, errorf(ErrInvalidArgument, "%s.begin: port %d is out of range 1-65535", name, p.Begin)
		case p.End == 0:
			return excl, shared, errorf(ErrInvalidArgument, "%s.end: missing (use end = begin for a single port)", name)
		case p.End > 65535:
			return excl, shared, errorf(ErrInvalidArgument, "%s.end: port %d is out of range 1-65535", name, p.End)
		case p.End < p.Begin:
			return excl, shared, errorf(ErrInvalidArgument, "%s: reversed range %d-%d (begin must be <= end)", name, p.Begin, p.End)
		}
		r := ephemeral.NewSet(ephemeral.Range{Begin: uint16(p.Begin), End: uint16(p.End)})
		if p.Shared {
			shared = shared.Union(r)
		} else {
			excl = excl.Union(r)
		}
	}
	if both := excl.Intersect(shared); !both.Empty() {
		return excl, shared, errorf(ErrInvalidArgument, "%s: ports %s are requested both shared and exclusive", field, both)
	}
	return excl, shared, nil
}

func validateID(id string) error {
	if id == "" {
		return errorf(ErrInvalidArgument, "container_id: must not be empty")
	}
	if err := plane.ValidateID(id); err != nil {
		return errorf(ErrInvalidArgument, "container_id: %v", err)
	}
	return nil
}

// validateLabels bounds the labels a caller may store.
func validateLabels(labels map[string]string) error {
	if len(labels) > 32 {
		return errorf(ErrInvalidArgument, "labels: %d labels, at most 32 allowed", len(labels))
	}
	for k, v := range labels {
		if k == "" || len(k) > 253 {
			return errorf(ErrInvalidArgument, "labels: key %q must be 1-253 characters", k)
		}
		if len(v) > 253 {
			return errorf(ErrInvalidArgument, "labels[%s]: value longer than 253 characters", k)
		}
	}
	return nil
}

// ledgerError maps a ledger refusal to an API error.
func ledgerError(id string, err error) error {
	var ce *ephemeral.ConflictError
	switch {
	case errors.As(err, &ce):
		return &Error{Kind: ErrFailedPrecondition, Msg: fmt.Sprintf("ports: %v", err), Err: err}
	case errors.Is(err, ephemeral.ErrNotManaged), errors.Is(err, ephemeral.ErrInEphemeralPool):
		return &Error{Kind: ErrInvalidArgument, Msg: fmt.Sprintf("ports: %v", err), Err: err}
	default:
		return &Error{Kind: ErrInvalidArgument, Msg: fmt.Sprintf("ports: container %s: %v", id, err), Err: err}
	}
}

func portsString(excl, shared ephemeral.Set) string {
	switch {
	case excl.Empty() && shared.Empty():
		return "none"
	case shared.Empty():
		return excl.String()
	case excl.Empty():
		return "shared " + shared.String()
	}
	return excl.String() + " + shared " + shared.String()
}
