package e2e

// podman 4 (Debian 12's, with its CNI backend) drives isolator-cni with the
// shipped example conflist: `podman run --rootfs ... --network isolator -p`
// from a busybox rootfs, isolatord in the sandbox host namespace, traffic
// from the sandbox client. podman keeps every root, run and config
// directory under a temporary directory; the container is only on the
// isolator network (never podman's default bridge network, which would
// program the root namespace).

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

type podman struct {
	t    *testing.T
	env  []string
	args []string // global flags
}

func newPodman(t *testing.T, socket string) *podman {
	t.Helper()
	dir := runtimeDir(t, "podman")
	confDir := filepath.Join(dir, "net.d")
	for _, d := range []string{confDir, filepath.Join(dir, "tmp")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	shippedConflist(t, confDir, socket)
	// runc: crun refuses this VM's hybrid cgroup layout; cgroupfs: no
	// systemd as PID 1; --ulimit host: no CAP_SYS_RESOURCE to raise limits.
	conf := fmt.Sprintf(`[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = %q
tmp_dir = %q
[network]
network_backend = "cni"
cni_plugin_dirs = [%q, "/usr/lib/cni"]
network_config_dir = %q
`, filepath.Join(dir, "events.log"), filepath.Join(dir, "tmp"), Binaries(t), confDir)
	confFile := filepath.Join(dir, "containers.conf")
	if err := os.WriteFile(confFile, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return &podman{t: t,
		env: []string{"CONTAINERS_CONF=" + confFile, "CONTAINERS_REGISTRIES_CONF=/dev/null"},
		args: []string{"--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "run"),
			"--storage-driver", "vfs", "--tmpdir", filepath.Join(dir, "tmp")},
	}
}

func (p *podman) run(args ...string) (string, error) {
	return runCmd(60*time.Second, p.env, "podman", append(slices.Clone(p.args), args...)...)
}

func (p *podman) must(args ...string) string {
	p.t.Helper()
	out, err := p.run(args...)
	if err != nil {
		p.t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(out)
}

// TestPodman: podman run --rootfs with -p on the isolator network: the
// container is reachable from outside on its mapped port, isolatorctl shows
// its CNI labels, podman's own namespace pin is left to podman, and podman
// rm leaves nothing in the host namespace.
func TestPodman(t *testing.T) {
	needTools(t, "podman", "runc", "conmon")
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{})
	base := readHostState(t, sb, d.NetNSDir)
	p := newPodman(t, d.Socket)
	rootfs := buildRootfs(t, runtimeDir(t, "podman-rootfs"))

	if out, err := p.run("network", "ls", "--format", "{{.Name}}"); err != nil || !strings.Contains(out, "isolator") {
		t.Skipf("podman cannot use its CNI backend here: %v\n%s", err, out)
	}
	name := sb.Name + "-pod"
	t.Cleanup(func() { p.run("rm", "-f", "-t", "0", name) })
	out, err := p.run("run", "-d", "--name", name, "--network", "isolator", "-p", "31001:31001", "--ulimit", "host",
		"--rootfs", rootfs, "/isotraffic", "serve", "--tcp", ":31001", "--udp", ":31001", "--name", "podweb")
	if err != nil {
		if strings.Contains(out, "cgroup") || strings.Contains(out, "OCI runtime") {
			t.Skipf("podman cannot run containers here: %v\n%s", err, out)
		}
		t.Fatalf("podman run: %v\n%s\nisolatord:\n%s", err, out, d.Log())
	}
	id := p.must("inspect", "--format", "{{.Id}}", name)

	var got ctlContainer
	wait.For(t, 20*time.Second, "podman container reachable on 31001", func() bool {
		s, err := echoFromClient(sb, "tcp", 31001)
		return err == nil && s == "podweb"
	})
	mustEcho(t, sb, "udp", 31001, "podweb")

	// Labels: the CNI network, shown by get and found by list --label.
	out = d.Ctl(t, "get", id)
	if !strings.Contains(out, "cni.network=isolator") {
		t.Errorf("isolatorctl get %s shows no CNI labels:\n%s", id, out)
	}
	var list []ctlContainer
	d.CtlJSON(t, &list, "list", "--label", "cni.network=isolator")
	if len(list) != 1 || list[0].ContainerID != id {
		t.Errorf("list --label cni.network=isolator = %+v, want %s", list, id)
	}
	d.CtlJSON(t, &got, "get", id)
	// podman pins the namespace itself (/run/netns/netns-*): isolatord's
	// pin is its own, elsewhere.
	sandboxKey := p.must("inspect", "--format", "{{.NetworkSettings.SandboxKey}}", name)
	if got.Netns == sandboxKey || got.Netns != filepath.Join(d.NetNSDir, id) {
		t.Errorf("isolatord pins %s at %s (podman's pin %s)", id, got.Netns, sandboxKey)
	}

	p.must("rm", "-f", "-t", "0", name)
	if c := cniGet(t, d, id); c != nil {
		t.Errorf("podman rm left %s in isolatord: %v", id, c)
	}
	if after := readHostState(t, sb, d.NetNSDir); fmt.Sprint(after) != fmt.Sprint(base) {
		t.Errorf("podman rm left kernel state behind:\nbefore %+v\nafter  %+v", base, after)
	}
	if s, err := echoFromClient(sb, "tcp", 31001); err == nil {
		t.Errorf("traffic still reaches %q after podman rm", s)
	}
}
