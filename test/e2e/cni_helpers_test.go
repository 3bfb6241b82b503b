package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

// cniNet is a CNI network the way a runtime sees it: a conflist file in a
// configuration directory, loaded with libcni, and a libcni runtime whose
// plugin path is the directory of the freshly built binaries.
type cniNet struct {
	Name     string
	ConfDir  string
	CacheDir string
	List     *libcni.NetworkConfigList
	CNI      *libcni.CNIConfig
}

// newCNINet writes NAME.conflist for isolator-cni (cniVersion version,
// socket, portMappings capability, plus extra JSON members of the plugin
// entry such as `"sharedPorts":[31443]`) and loads it as a runtime would.
func newCNINet(t *testing.T, binDir, socket, name, version, extra string) *cniNet {
	t.Helper()
	confDir, cacheDir := t.TempDir(), t.TempDir()
	conf := fmt.Sprintf(`{
  "cniVersion": %q,
  "name": %q,
  "plugins": [
    {
      "type": "isolator-cni",
      "socket": %q,
      "capabilities": {"portMappings": true}%s
    }
  ]
}
`, version, name, socket, extra)
	if err := os.WriteFile(filepath.Join(confDir, name+".conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	list, err := libcni.LoadConfList(confDir, name)
	if err != nil {
		t.Fatalf("load conflist %s: %v\n%s", name, err, conf)
	}
	return &cniNet{
		Name: name, ConfDir: confDir, CacheDir: cacheDir, List: list,
		CNI: libcni.NewCNIConfigWithCacheDir([]string{binDir}, cacheDir, nil),
	}
}

// withEmptyCache returns the same network seen by a runtime that has no
// cached attachments (a fresh node agent): libcni's GC then issues no DEL of
// its own, so whatever is removed is removed by the plugin's GC.
func (n *cniNet) withEmptyCache(t *testing.T) *cniNet {
	t.Helper()
	c := *n
	c.CacheDir = t.TempDir()
	c.CNI = libcni.NewCNIConfigWithCacheDir(n.CNI.Path, c.CacheDir, nil)
	return &c
}

func cniCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// cniPortMappings are the portMappings a runtime passes for ports published
// on the same number inside and outside, tcp and udp each (as Nomad does).
func cniPortMappings(ports ...int) []map[string]any {
	var out []map[string]any
	for _, p := range ports {
		for _, proto := range []string{"tcp", "udp"} {
			out = append(out, map[string]any{"hostPort": p, "containerPort": p, "protocol": proto})
		}
	}
	return out
}

// cniRuntime is the RuntimeConf of one container attachment.
func cniRuntime(id, netnsPath string, mappings []map[string]any, args ...[2]string) *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{
		ContainerID: id,
		NetNS:       netnsPath,
		IfName:      "eth0",
		Args:        append([][2]string{{"IgnoreUnknown", "1"}}, args...),
	}
	if mappings != nil {
		rt.CapabilityArgs = map[string]any{"portMappings": mappings}
	}
	return rt
}

// cniErrCode returns the CNI error code of err, failing if err is not a CNI error.
func cniErrCode(t *testing.T, err error) (uint, string) {
	t.Helper()
	var e *types.Error
	if !errors.As(err, &e) {
		t.Fatalf("want a CNI error, got %T: %v", err, err)
	}
	return e.Code, e.Msg
}
