package main

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Plugin-defined CNI error codes (the spec reserves 100 and above for
// plugins). The message is always the daemon's, which names the field or
// the holder of a contested port.
const (
	// ErrPortUnavailable: isolatord refused because of the state of things
	// (FAILED_PRECONDITION): a port is held by another container, a port is
	// outside the managed static ports, the container is in the wrong state.
	ErrPortUnavailable uint = 100
	// ErrContainerExists: the container ID is already known to isolatord
	// with other ports, another namespace or for another network
	// (ALREADY_EXISTS).
	ErrContainerExists uint = 101
	// ErrNoCapacity: no free ephemeral port block or container slot
	// (RESOURCE_EXHAUSTED).
	ErrNoCapacity uint = 102
	// ErrNotAuthorized: the daemon refused the caller (PERMISSION_DENIED,
	// UNAUTHENTICATED): the plugin runs as a uid not in --allow-uid.
	ErrNotAuthorized uint = 103
	// ErrCheckFailed: CHECK found the container different from what the
	// configuration and prevResult describe.
	ErrCheckFailed uint = 104
)

// cniCode maps a gRPC status code from isolatord to a CNI error code.
// field is the API field the call was about, to tell a missing network
// namespace (NOT_FOUND on netns_path) from an unknown container.
func cniCode(c codes.Code, netnsCall bool) uint {
	switch c {
	case codes.InvalidArgument, codes.OutOfRange:
		return types.ErrInvalidNetworkConfig
	case codes.FailedPrecondition:
		return ErrPortUnavailable
	case codes.AlreadyExists:
		return ErrContainerExists
	case codes.ResourceExhausted:
		return ErrNoCapacity
	case codes.NotFound:
		if netnsCall {
			return types.ErrInvalidNetNS
		}
		return types.ErrUnknownContainer
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted:
		return types.ErrTryAgainLater
	case codes.PermissionDenied, codes.Unauthenticated:
		return ErrNotAuthorized
	case codes.Unimplemented:
		return types.ErrIncompatibleCNIVersion
	}
	return types.ErrInternal
}

// daemonError turns an error from an isolatord RPC into a CNI error whose
// message is the daemon's message and whose details name the call and the
// gRPC code. An error that already is a CNI error is returned as is.
func daemonError(rpc string, err error) error {
	if err == nil {
		return nil
	}
	var ce *types.Error
	if errors.As(err, &ce) {
		return ce
	}
	st, ok := status.FromError(err)
	if !ok {
		return types.NewError(types.ErrInternal, "isolatord "+rpc+": "+err.Error(), "")
	}
	msg := st.Message()
	if st.Code() == codes.Unavailable || st.Code() == codes.DeadlineExceeded {
		msg = "isolatord did not answer " + rpc + ": " + msg
	}
	details := fmt.Sprintf("isolatord %s: %s", rpc, st.Code())
	if st.Code() == codes.Unimplemented {
		details += " (isolatord is older than isolator-cni: restart it after an upgrade)"
	}
	return types.NewError(cniCode(st.Code(), rpc == "Isolate" || rpc == "Attach"), msg, details)
}

// connectError is the CNI error for a daemon that cannot be reached: try
// again later (11), naming the socket and the system error.
func connectError(err error) error {
	return types.NewError(types.ErrTryAgainLater, err.Error(), "is the isolatord service running, and is \"socket\" in the network configuration its --socket?")
}

// isCode reports whether err is a gRPC status with code c.
func isCode(err error, c codes.Code) bool {
	return err != nil && status.Code(err) == c
}
