package api_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestShortLivedClientsLinkNoTransport: the light client and the programs
// that start once per call (the CNI plugin, the CLI) link neither grpc-go's
// transport nor net/http or TLS, whose initialisation and size are most of
// what such a process would spend before its first call.
func TestShortLivedClientsLinkNoTransport(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list dependencies with")
	}
	forbidden := []string{"net/http", "crypto/tls", "crypto/x509", "google.golang.org/grpc", "golang.org/x/net/http2"}
	for _, pkg := range []string{".", "../cmd/isolator-cni", "../cmd/isolatorctl"} {
		out, err := exec.Command(goBin, "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, f := range forbidden {
				if dep == f {
					t.Errorf("%s links %s", pkg, dep)
				}
			}
		}
	}
}

// TestPluginLinksNoReflectionOrGRPC: the CNI plugin, executed for every
// attachment, links no grpc-go package (grpclog's initialisation comes with
// any of them), no protobuf package (the generated messages' reflection
// registers descriptors at start-up, and even protowire brings detrand,
// which reads the executable; liteclient encodes what it sends) and no
// netlink library (it reads the container's interface with
// three requests of its own).
func TestPluginLinksNoReflectionOrGRPC(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list dependencies with")
	}
	out, err := exec.Command(goBin, "list", "-deps", "../cmd/isolator-cni").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		switch {
		case strings.HasPrefix(dep, "google.golang.org/grpc"), strings.HasPrefix(dep, "google.golang.org/genproto"),
			strings.HasPrefix(dep, "google.golang.org/protobuf/"),
			dep == "github.com/isolatord/isolatord/api/isolatord/v1", dep == "github.com/isolatord/isolatord/api",
			strings.HasPrefix(dep, "github.com/vishvananda/netlink"):
			t.Errorf("the CNI plugin links %s", dep)
		}
	}
}
