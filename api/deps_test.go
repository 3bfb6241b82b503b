package api_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestOneClientStack: every command reaches isolatord through grpc-go and
// the generated stubs; the hand-written HTTP/2 client (api/unarygrpc) and
// protobuf codec (api/liteclient) are gone and nothing links them again.
func TestOneClientStack(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list dependencies with")
	}
	out, err := exec.Command(goBin, "list", "-deps", "../cmd/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/...: %v\n%s", err, out)
	}
	deps := map[string]bool{}
	for _, dep := range strings.Fields(string(out)) {
		deps[dep] = true
		if strings.Contains(dep, "unarygrpc") || strings.Contains(dep, "liteclient") {
			t.Errorf("./cmd/... links %s", dep)
		}
	}
	for _, want := range []string{"google.golang.org/grpc", "github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"} {
		if !deps[want] {
			t.Errorf("./cmd/... does not link %s", want)
		}
	}
}

// TestClientsBuildWithoutTrace: make build builds the plugin and the CLI
// with grpc-go's grpcnotrace tag, which must keep golang.org/x/net/trace
// (and html/template, which it brings) out of them.
func TestClientsBuildWithoutTrace(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list dependencies with")
	}
	for _, pkg := range []string{"../cmd/isolator-cni", "../cmd/isolatorctl"} {
		out, err := exec.Command(goBin, "list", "-tags", "grpcnotrace", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if dep == "golang.org/x/net/trace" || dep == "html/template" {
				t.Errorf("%s built with grpcnotrace links %s", pkg, dep)
			}
		}
	}
}
