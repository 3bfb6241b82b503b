package unarygrpc

import (
	"context"
	"errors"
	"strconv"
)

// Code is a gRPC status code, numbered as google.golang.org/grpc/codes
// numbers them (that package would link grpc-go's logging into every
// client; convert with codes.Code(c)).
type Code uint32

// The gRPC status codes.
const (
	OK                 Code = 0
	Canceled           Code = 1
	Unknown            Code = 2
	InvalidArgument    Code = 3
	DeadlineExceeded   Code = 4
	NotFound           Code = 5
	AlreadyExists      Code = 6
	PermissionDenied   Code = 7
	ResourceExhausted  Code = 8
	FailedPrecondition Code = 9
	Aborted            Code = 10
	OutOfRange         Code = 11
	Unimplemented      Code = 12
	Internal           Code = 13
	Unavailable        Code = 14
	DataLoss           Code = 15
	Unauthenticated    Code = 16
)

var codeNames = [...]string{
	"OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
	"AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition",
	"Aborted", "OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss",
	"Unauthenticated",
}

// String is the code's name as codes.Code.String gives it.
func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return "Code(" + strconv.FormatUint(uint64(c), 10) + ")"
}

// Error is a call's status other than OK: the server's code and message,
// or the one this client gives a failed connection or an ended context.
type Error struct {
	Code    Code
	Message string
}

// Error reads as a grpc-go status error does.
func (e *Error) Error() string {
	return "rpc error: code = " + e.Code.String() + " desc = " + e.Message
}

// errorf is an *Error with code c and message s.
func errorf(c Code, s string) error { return &Error{Code: c, Message: s} }

// CodeOf is err's code: OK for nil, the code of an *Error err wraps, else
// Unknown.
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return Unknown
}

// contextError is the status of a call whose context ended with err.
func contextError(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return errorf(DeadlineExceeded, "context deadline exceeded")
	}
	return errorf(Canceled, "context canceled")
}

// HandshakeError is a call's failure before the server's HTTP/2 greeting
// arrived: nothing was served on the connection (the server never took
// it, did not speak HTTP/2 within the time Dial allowed, or closed it).
// It is what a dial that waited for the greeting would have returned.
type HandshakeError struct {
	Err error
}

func (e *HandshakeError) Error() string { return "HTTP/2 handshake: " + e.Err.Error() }

// Unwrap returns the cause (context.DeadlineExceeded when Dial's deadline
// passed first).
func (e *HandshakeError) Unwrap() error { return e.Err }
