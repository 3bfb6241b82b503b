package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// rpcError is the error a call returns for the daemon's status.
func rpcError(c codes.Code, msg string) error { return status.Error(c, msg) }

func TestCNICodeMapping(t *testing.T) {
	for _, tc := range []struct {
		code   codes.Code
		netns  bool
		want   uint
		reason string
	}{
		{codes.InvalidArgument, false, types.ErrInvalidNetworkConfig, "bad request = bad config"},
		{codes.FailedPrecondition, false, ErrPortUnavailable, "port conflict"},
		{codes.AlreadyExists, false, ErrContainerExists, "other ports"},
		{codes.ResourceExhausted, false, ErrNoCapacity, "no block"},
		{codes.NotFound, false, types.ErrUnknownContainer, "unknown container"},
		{codes.NotFound, true, types.ErrInvalidNetNS, "namespace missing"},
		{codes.Unavailable, false, types.ErrTryAgainLater, "daemon going away"},
		{codes.DeadlineExceeded, false, types.ErrTryAgainLater, "slow daemon"},
		{codes.PermissionDenied, false, ErrNotAuthorized, "uid not allowed"},
		{codes.Internal, false, types.ErrInternal, "kernel refused"},
		{codes.Unknown, false, types.ErrInternal, "anything else"},
	} {
		if got := cniCode(tc.code, tc.netns); got != tc.want {
			t.Errorf("%s (netns=%v, %s): CNI code %d, want %d", tc.code, tc.netns, tc.reason, got, tc.want)
		}
	}
	for _, c := range []uint{ErrPortUnavailable, ErrContainerExists, ErrNoCapacity, ErrNotAuthorized, ErrCheckFailed} {
		if c < 100 {
			t.Errorf("plugin-defined code %d must be >= 100", c)
		}
	}
}

func TestDaemonErrorKeepsMessage(t *testing.T) {
	err := daemonError("Prepare", rpcError(codes.FailedPrecondition, "ports: port 31001 is held exclusively by c1"))
	e := cniErr(t, err, ErrPortUnavailable)
	if e.Msg != "ports: port 31001 is held exclusively by c1" {
		t.Errorf("message = %q, want the daemon's", e.Msg)
	}
	if !strings.Contains(e.Details, "Prepare") || !strings.Contains(e.Details, "FailedPrecondition") {
		t.Errorf("details = %q, want the RPC and the gRPC code", e.Details)
	}

	e = cniErr(t, daemonError("Isolate", rpcError(codes.NotFound, "netns_path: /run/netns/x: no such file or directory")), types.ErrInvalidNetNS)
	if !strings.Contains(e.Msg, "netns_path") {
		t.Errorf("message = %q", e.Msg)
	}
	e = cniErr(t, daemonError("Attach", rpcError(codes.NotFound, "netns_path: /proc/9/ns/net: no such file or directory")), types.ErrInvalidNetNS)
	if !strings.Contains(e.Details, "Attach") {
		t.Errorf("details = %q", e.Details)
	}
	// A daemon older than the plugin does not know Attach: the details say
	// what to do.
	e = cniErr(t, daemonError("Attach", rpcError(codes.Unimplemented, "unknown method Attach for service isolatord.v1.Isolator")), types.ErrIncompatibleCNIVersion)
	if !strings.Contains(e.Details, "older") {
		t.Errorf("details = %q", e.Details)
	}
	e = cniErr(t, daemonError("Get", rpcError(codes.Unavailable, "connection refused")), types.ErrTryAgainLater)
	if !strings.Contains(e.Msg, "did not answer Get") {
		t.Errorf("message = %q", e.Msg)
	}
	cniErr(t, daemonError("List", errors.New("plain")), types.ErrInternal)
	orig := types.NewError(ErrCheckFailed, "x", "")
	if got := daemonError("Get", orig); got != orig {
		t.Errorf("a CNI error must pass through unchanged, got %v", got)
	}
	if daemonError("Get", nil) != nil {
		t.Error("nil must stay nil")
	}
	cniErr(t, connectError(errors.New("cannot connect to isolatord at /x: no such file or directory")), types.ErrTryAgainLater)
}
