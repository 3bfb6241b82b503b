package api

import (
	"fmt"

	isolatordv1 "github.com/isolatord/isolatord/api/isolatord/v1"
)

// StateName is the lower-case name of a container state, as clients show
// it: "prepared", "isolated" ("unspecified", or "unknown(N)" for a state
// this client does not know).
func StateName(s isolatordv1.ContainerState) string {
	switch s {
	case isolatordv1.ContainerState_CONTAINER_STATE_UNSPECIFIED:
		return "unspecified"
	case isolatordv1.ContainerState_CONTAINER_STATE_PREPARED:
		return "prepared"
	case isolatordv1.ContainerState_CONTAINER_STATE_ISOLATED:
		return "isolated"
	}
	return fmt.Sprintf("unknown(%d)", int32(s))
}
