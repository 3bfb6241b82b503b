package unarygrpc_test

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/isolatord/isolatord/api/unarygrpc"
)

// TestCodesAreGRPCs: every code has grpc-go's number and name, and an
// Error reads as grpc-go's status error does.
func TestCodesAreGRPCs(t *testing.T) {
	for i := uint32(0); i <= 20; i++ {
		if got, want := unarygrpc.Code(i).String(), codes.Code(i).String(); got != want {
			t.Errorf("code %d is %q, grpc-go says %q", i, got, want)
		}
	}
	for c, want := range map[unarygrpc.Code]codes.Code{
		unarygrpc.OK: codes.OK, unarygrpc.NotFound: codes.NotFound, unarygrpc.FailedPrecondition: codes.FailedPrecondition,
		unarygrpc.Unavailable: codes.Unavailable, unarygrpc.Unauthenticated: codes.Unauthenticated,
	} {
		if uint32(c) != uint32(want) {
			t.Errorf("%v is %d, grpc-go's %d", c, uint32(c), uint32(want))
		}
	}
	err := &unarygrpc.Error{Code: unarygrpc.NotFound, Message: "container_id: c1 is not known"}
	if got, want := err.Error(), "rpc error: code = NotFound desc = container_id: c1 is not known"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if c := unarygrpc.CodeOf(fmt.Errorf("wrapped: %w", err)); c != unarygrpc.NotFound {
		t.Errorf("CodeOf(wrapped) = %v", c)
	}
	if c := unarygrpc.CodeOf(nil); c != unarygrpc.OK {
		t.Errorf("CodeOf(nil) = %v", c)
	}
	if c := unarygrpc.CodeOf(fmt.Errorf("plain")); c != unarygrpc.Unknown {
		t.Errorf("CodeOf(plain) = %v", c)
	}
}
