// Command isolator-cni is isolatord's CNI plugin: a thin binary that
// container runtimes speaking CNI (containerd/CRI, CRI-O, Nomad's cni/NAME
// networks) execute, and that turns each CNI verb into calls to isolatord's
// gRPC API on its unix socket, the way the CNI dhcp plugin talks to its
// daemon (through grpc-go and the generated client, api.Dial). It keeps no state of its own: isolatord holds everything, and
// every container the plugin prepares carries the labels cni.network (the
// network name) and cni.ifname, so DEL, CHECK and GC only ever touch this
// network's containers.
//
// Verbs (CNI spec 1.1; versions 0.4.0, 1.0.0 and 1.1.0 are supported where
// the verb exists):
//
//   - ADD: Attach, isolatord's Prepare(CNI_CONTAINERID, ports, labels) then
//     Isolate(netns_path = CNI_NETNS) in one call. The ports are the configuration's "ports" and
//     "sharedPorts", runtimeConfig.portMappings (one port per hostPort,
//     whatever the protocols) and CNI_ARGS ISOLATOR_SHARED_PORTS. There is
//     no NAT: a mapping whose containerPort differs from its hostPort is
//     refused (code 7). If Isolate fails, isolatord cleans the prepared
//     container up again (and the plugin does if reading the result fails).
//     The result reports the host end of the veth and eth0 inside the
//     namespace with the host's address, prefix, MAC and gateway, as
//     Attach's reply describes them (read from the namespace when the
//     reply has no eth0: the container was isolated before). A retried ADD (same ports, same namespace)
//     succeeds.
//   - DEL: Cleanup, which isolatord carries out only if the container has
//     this network's labels (require_labels). Succeeds when the daemon does not know the container,
//     when it belongs to another network, or when its namespace is gone.
//     Fails (code 11, try again later) when the daemon cannot be reached,
//     because then nobody knows whether its ports are still held.
//   - CHECK: Get; the container must be isolated in CNI_NETNS with exactly
//     the ports the configuration asks for, and eth0 must match prevResult.
//   - GC: Cleanup of every container of this network that is not in
//     cni.dev/valid-attachments.
//   - STATUS: the Status RPC within 5 s; code 50 when the daemon does not
//     answer.
//
// Errors from the daemon become CNI errors carrying the daemon's message:
// INVALID_ARGUMENT -> 7, NOT_FOUND -> 3 (8 for the namespace),
// FAILED_PRECONDITION -> 100, ALREADY_EXISTS -> 101, RESOURCE_EXHAUSTED ->
// 102, PERMISSION_DENIED -> 103, UNAVAILABLE -> 11, anything else -> 999.
// CHECK mismatches are 104. See docs/cni.md.
package main

import (
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/isolatord/isolatord/cmd/internal/buildinfo"
)

// buildVersion is set at build time with -ldflags "-X main.buildVersion=..."
// (make build does); otherwise the version the Go build recorded is used.
var buildVersion = "dev"

// supportedVersions are the CNI spec versions the plugin speaks. CHECK
// needs 0.4.0, GC and STATUS 1.1.0 (skel enforces both).
var supportedVersions = version.PluginSupports("0.4.0", "1.0.0", "1.1.0")

func main() {
	p := newPlugin(os.Stdout)
	// The plugin checks CNI_NETNS against its own namespace itself
	// (netnscheck.go), without the OS thread skel's check locks.
	override := netnsOverride(os.Getenv("CNI_NETNS_OVERRIDE"))
	os.Setenv("CNI_NETNS_OVERRIDE", "1")
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:    netnsChecked(p.Add, override),
		Del:    netnsChecked(p.Del, override),
		Check:  p.Check,
		GC:     p.GC,
		Status: p.Status,
	}, supportedVersions, "CNI plugin isolator-cni "+buildinfo.Version(buildVersion)+" (isolatord)")
}
