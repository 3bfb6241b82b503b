package isolator

import (
	"errors"
	"fmt"
)

// Kind is a class of lifecycle errors. Kinds say nothing of a transport:
// the daemon maps them to gRPC codes in one place. Test with errors.Is
// (an *Error wraps its kind) or KindOf.
type Kind struct {
	name string // e.g. "NotFound"
	text string // e.g. "not found"
}

func (k *Kind) Error() string { return k.text }

// String is the kind's name in CamelCase ("NotFound"), as metrics label it.
func (k *Kind) String() string { return k.name }

// Kinds of lifecycle errors.
var (
	// ErrInvalidArgument: the request is malformed, whatever the state.
	ErrInvalidArgument = &Kind{"InvalidArgument", "invalid argument"}
	// ErrNotFound: the container, process or namespace named does not exist.
	ErrNotFound = &Kind{"NotFound", "not found"}
	// ErrAlreadyExists: the container exists (or is isolated) already, otherwise.
	ErrAlreadyExists = &Kind{"AlreadyExists", "already exists"}
	// ErrFailedPrecondition: the request is valid but the state refuses it
	// (a port held by another, a namespace that is not a container's, a
	// container not prepared, a kernel without the feature).
	ErrFailedPrecondition = &Kind{"FailedPrecondition", "failed precondition"}
	// ErrResourceExhausted: no ephemeral block or container slot is left.
	ErrResourceExhausted = &Kind{"ResourceExhausted", "resource exhausted"}
	// ErrInternal: the kernel, the disk or the lifecycle itself failed.
	ErrInternal = &Kind{"Internal", "internal error"}
)

// Error is a lifecycle error of a Kind. Its message names the offending
// field or the holder of a contested port.
type Error struct {
	Kind *Kind
	Msg  string
	Err  error // optional cause
}

func (e *Error) Error() string { return e.Msg }

// Unwrap returns the kind and the cause.
func (e *Error) Unwrap() []error {
	out := []error{e.Kind}
	if e.Err != nil {
		out = append(out, e.Err)
	}
	return out
}

func errorf(k *Kind, format string, args ...any) *Error {
	return &Error{Kind: k, Msg: fmt.Sprintf(format, args...)}
}

func wrapf(k *Kind, err error, format string, args ...any) *Error {
	return &Error{Kind: k, Msg: fmt.Sprintf(format, args...) + ": " + err.Error(), Err: err}
}

// KindOf returns the kind of err: that of the outermost *Error in its
// chain, ErrInternal for anything else, nil for nil.
func KindOf(err error) *Kind {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) && e.Kind != nil {
		return e.Kind
	}
	return ErrInternal
}
