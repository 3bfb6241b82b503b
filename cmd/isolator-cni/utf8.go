package main

import (
	"fmt"
	"unicode/utf8"

	"github.com/containernetworking/cni/pkg/types"
)

// checkUTF8 refuses, before any call, what ADD would send isolatord that is
// not valid UTF-8 (the API's strings are UTF-8; isolatord could not read
// the request): CNI_NETNS and the CNI_ARGS values kept as labels. The
// container ID, the interface name and the network name pass checks of
// their own characters, and the configuration is JSON.
func checkUTF8(netns string, a cniArgs) error {
	if !utf8.ValidString(netns) {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("isolator-cni: CNI_NETNS %q is not valid UTF-8", netns), "")
	}
	for _, k := range labelArgs {
		if v, ok := a[k]; ok && !utf8.ValidString(v) {
			return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("isolator-cni: CNI_ARGS %s=%q is not valid UTF-8", k, v), "")
		}
	}
	return nil
}
