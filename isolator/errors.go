package isolator

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
)

// Error is a lifecycle error with the gRPC code the API answers with. Its
// message names the offending field or the holder of a contested port.
type Error struct {
	Code codes.Code
	Msg  string
	Err  error // optional cause
}

func (e *Error) Error() string { return e.Msg }
func (e *Error) Unwrap() error { return e.Err }

func errorf(code codes.Code, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

func wrapf(code codes.Code, err error, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...) + ": " + err.Error(), Err: err}
}

// CodeOf returns the gRPC code of err: the code of an *Error in its chain, or
// codes.Internal for anything else (codes.OK for nil).
func CodeOf(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return codes.Internal
}
