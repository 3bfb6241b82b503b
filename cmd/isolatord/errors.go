package main

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/isolatord/isolatord/isolator"
)

// grpcCodes maps the lifecycle's error kinds to gRPC codes: the one place
// where a domain error becomes a transport's.
var grpcCodes = map[*isolator.Kind]codes.Code{
	isolator.ErrInvalidArgument:    codes.InvalidArgument,
	isolator.ErrNotFound:           codes.NotFound,
	isolator.ErrAlreadyExists:      codes.AlreadyExists,
	isolator.ErrFailedPrecondition: codes.FailedPrecondition,
	isolator.ErrResourceExhausted:  codes.ResourceExhausted,
	isolator.ErrInternal:           codes.Internal,
}

// toStatus turns a lifecycle error into a gRPC status with the code of its
// kind and its message (which names the field, or the holder of a port).
// A status error passes through.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code, ok := grpcCodes[isolator.KindOf(err)]
	if !ok {
		code = codes.Internal
	}
	return status.Error(code, err.Error())
}
