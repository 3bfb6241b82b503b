package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/isolatord/isolatord/dataplane"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
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

// cniServe starts a container running isotraffic serve on the ports (TCP
// and UDP each), answering with name.
func cniServe(t *testing.T, sb *sandbox.Sandbox, name string, ports ...int) *sandbox.Container {
	t.Helper()
	var addrs []string
	for _, p := range ports {
		addrs = append(addrs, ":"+strconv.Itoa(p))
	}
	list := strings.Join(addrs, ",")
	c := sb.StartContainer(t, name, traffic.BinaryPath(t), "serve", "--tcp", list, "--udp", list, "--name", name)
	c.WaitFor(t, "ready", 10*time.Second)
	return c
}

// cniEcho sends one message from the client namespace to the sandbox host's
// IP and port and returns the name of the server that answered.
func cniEcho(sb *sandbox.Sandbox, network string, port int) (string, error) {
	var reply string
	err := sb.Client.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		r, err := traffic.Echo(ctx, network, net.JoinHostPort(sb.HostIP.String(), strconv.Itoa(port)), "hi", traffic.WithTimeout(2*time.Second))
		reply = r
		return err
	})
	return traffic.ReplyName(reply), err
}

func cniMustEcho(t *testing.T, sb *sandbox.Sandbox, network string, port int, want string) {
	t.Helper()
	got, err := cniEcho(sb, network, port)
	if err != nil || got != want {
		t.Fatalf("%s from the client to %s:%d: got %q, %v; want %q", network, sb.HostIP, port, got, err, want)
	}
}

// cniKernelState is what of isolatord's exists in the sandbox host: its
// veths, the tc filter rules on eth0 and lo ingress, and the namespace bind
// mounts in the daemon's netns directory. Rules are u32 key nodes ("fh
// 800::3"); hash tables ("fh 179: ht divisor 16") are not counted, because
// the data plane may keep an empty per-port-bucket table after its last
// rule is gone.
type cniKernelState struct {
	Veths   []string
	Filters int
	Mounts  []string
}

func readCNIKernelState(t *testing.T, sb *sandbox.Sandbox, netnsDir string) cniKernelState {
	t.Helper()
	var ks cniKernelState
	for _, line := range strings.Split(sb.Host.Run(t, "ip", "-o", "link", "show"), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 {
			name := strings.TrimSuffix(strings.SplitN(f[1], "@", 2)[0], ":")
			if strings.HasPrefix(name, dataplane.VethPrefix) {
				ks.Veths = append(ks.Veths, name)
			}
		}
	}
	for _, dev := range []string{"eth0", "lo"} {
		for _, line := range strings.Split(sb.Host.Run(t, "tc", "filter", "show", "dev", dev, "ingress"), "\n") {
			if isTCRule(line) {
				ks.Filters++
			}
		}
	}
	if ents, err := os.ReadDir(netnsDir); err == nil {
		for _, e := range ents {
			ks.Mounts = append(ks.Mounts, e.Name())
		}
	}
	sort.Strings(ks.Veths)
	return ks
}

func (k cniKernelState) String() string {
	return fmt.Sprintf("veths %v, %d filter rules, mounts %v", k.Veths, k.Filters, k.Mounts)
}

// isTCRule reports whether a `tc filter show` line is a u32 rule (its
// handle has a node part, "fh 800::3"), not a hash table or a chain head.
func isTCRule(line string) bool {
	_, rest, ok := strings.Cut(line, " fh ")
	if !ok {
		return false
	}
	handle, _, _ := strings.Cut(rest, " ")
	_, node, ok := strings.Cut(handle, "::")
	return ok && node != ""
}
