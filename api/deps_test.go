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
