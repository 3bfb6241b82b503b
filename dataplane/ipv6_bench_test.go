package dataplane

import (
	"testing"

	"github.com/isolatord/isolatord/test/sandbox"
)

// BenchmarkSetupTeardownIPv6 measures Setup and Teardown of one container
// (as BenchmarkDataPlane's SetupTeardown does, on an otherwise empty host
// with IPv6) with containers' IPv6 off and on: what the IPv6 configuration
// of a namespace (settings, addresses, routes, its neighbour settings)
// adds to a setup.
func BenchmarkSetupTeardownIPv6(b *testing.B) {
	for _, mode := range []IPv6Mode{IPv6Off, IPv6On} {
		b.Run("ipv6="+mode.String(), func(b *testing.B) {
			e := newEnvWith(b, mode, sandbox.WithIPv6())
			e.benchSetupTeardown(b)
		})
	}
}
