package api

import (
	"testing"

	isolatordv1 "github.com/isolatord/isolatord/api/isolatord/v1"
)

func TestStateName(t *testing.T) {
	for s, want := range map[isolatordv1.ContainerState]string{
		isolatordv1.ContainerState_CONTAINER_STATE_UNSPECIFIED: "unspecified",
		isolatordv1.ContainerState_CONTAINER_STATE_PREPARED:    "prepared",
		isolatordv1.ContainerState_CONTAINER_STATE_ISOLATED:    "isolated",
		7: "unknown(7)",
	} {
		if got := StateName(s); got != want {
			t.Errorf("StateName(%d) = %q, want %q", s, got, want)
		}
	}
}
