package main

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/isolatord/isolatord/isolator"
)

func TestToStatus(t *testing.T) {
	for k, c := range grpcCodes {
		if k.String() != c.String() {
			t.Errorf("kind %s maps to code %s", k, c)
		}
		err := fmt.Errorf("outer: %w", &isolator.Error{Kind: k, Msg: "ports: 31005 is held by nginx (pid 42)"})
		st, _ := status.FromError(toStatus(err))
		if st.Code() != c || st.Message() != err.Error() {
			t.Errorf("%s: status %v %q", k, st.Code(), st.Message())
		}
	}
	if st, _ := status.FromError(toStatus(errors.New("disk full"))); st.Code() != codes.Internal {
		t.Errorf("an error of no kind: %v, want Internal", st.Code())
	}
	pass := status.Error(codes.InvalidArgument, "pid: must be > 0")
	if got := toStatus(pass); got != pass {
		t.Errorf("a status error changed: %v", got)
	}
	if toStatus(nil) != nil {
		t.Error("nil is not nil")
	}
}
