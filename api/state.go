package api

import (
	isolatordv1 "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/api/liteclient"
)

// StateName is the lower-case name of a container state, as clients show
// it: "prepared", "isolated" ("unspecified", or "unknown(N)" for a state
// this client does not know).
func StateName(s isolatordv1.ContainerState) string {
	return liteclient.StateName(liteclient.ContainerState(s))
}
