package e2e

// containerd 1.6 (Debian 12's) `ctr run --cni` drives isolator-cni with the
// shipped example conflist. ctr reads /etc/cni/net.d and /opt/cni/bin and
// nothing else, so each ctr runs in a private mount namespace where the
// test's own directories are bind-mounted over those two (the machine's
// files are never touched, and podman's bridge conflist there is never
// seen). containerd runs with its own root, state and socket under a
// temporary directory, without its CRI plugin, and is stopped by pid.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

type containerd struct {
	t       *testing.T
	address string
	ns      string // ctr namespace: the CNI container id is <ns>-<id>
	confDir string // bind-mounted over /etc/cni/net.d for ctr
	optDir  string // bind-mounted over /opt for ctr (holds cni/bin)
	cmd     *exec.Cmd
}

func startContainerd(t *testing.T, name, socket string) *containerd {
	t.Helper()
	return startContainerdWith(t, name, socket, nil)
}

// startContainerdWith starts containerd; cri, when given, returns the CRI
// plugin's configuration section (the CNI directories are c's), else the
// CRI plugin is disabled.
func startContainerdWith(t *testing.T, name, socket string, cri func(c *containerd) string) *containerd {
	t.Helper()
	dir := runtimeDir(t, "containerd")
	c := &containerd{t: t, address: filepath.Join(dir, "containerd.sock"), ns: name,
		confDir: filepath.Join(dir, "net.d"), optDir: filepath.Join(dir, "opt")}
	bin := filepath.Join(c.optDir, "cni", "bin")
	for _, d := range []string{c.confDir, bin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	shippedConflist(t, c.confDir, socket)
	copyFile(t, filepath.Join(Binaries(t), "isolator-cni"), filepath.Join(bin, "isolator-cni"))
	top, criConf := `disabled_plugins = ["io.containerd.grpc.v1.cri"]`, ""
	if cri != nil {
		top, criConf = "", cri(c)
	}
	conf := fmt.Sprintf(`version = 2
root = %q
state = %q
%s
[grpc]
  address = %q
[ttrpc]
  address = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
%s
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), top, c.address, c.address+".ttrpc", filepath.Join(dir, "copt"), criConf)
	confFile := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(confFile, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	c.cmd = exec.Command("containerd", "--config", confFile)
	c.cmd.Stdout, c.cmd.Stderr = log, log
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Containers first (their shims exit with them), then containerd, by pid.
		if out, err := c.ctr("containers", "ls", "-q"); err == nil {
			for _, id := range strings.Fields(out) {
				c.ctr("task", "kill", "-s", "SIGKILL", id)
				c.ctr("task", "rm", "-f", id)
				c.ctr("containers", "rm", id)
			}
		}
		c.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { c.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			c.cmd.Process.Kill()
			<-done
		}
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			t.Logf("containerd log:\n%s", tail(string(b), 40))
		}
	})
	wait.For(t, 20*time.Second, "containerd serving on "+c.address, func() bool {
		_, err := c.ctr("version")
		return err == nil
	})
	return c
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ctr runs ctr against this containerd, in this test's ctr namespace.
func (c *containerd) ctr(args ...string) (string, error) {
	return runCmd(60*time.Second, nil, "ctr", append([]string{"--address", c.address, "-n", c.ns}, args...)...)
}

// ctrCNICommand is ctr with args in a private mount namespace whose
// /etc/cni/net.d and /opt are the test's.
func (c *containerd) ctrCNICommand(args ...string) *exec.Cmd {
	script := `mount --bind "$1" /etc/cni/net.d && mount --bind "$2" /opt && shift 2 && exec ctr "$@"`
	argv := append([]string{"--mount", "--propagation", "private", "sh", "-c", script, "sh", c.confDir, c.optDir,
		"--address", c.address, "-n", c.ns}, args...)
	cmd := exec.Command("unshare", argv...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

func (c *containerd) ctrCNI(args ...string) (string, error) {
	cmd := c.ctrCNICommand(args...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// serveFirstEphemeral is a container command serving TCP and UDP on the
// first port of the container's ephemeral block, as isolatord set it
// before the task started. ctr has no port mappings, and the shipped
// conflist no static ports: the block is all the container holds, and it
// is reachable from outside.
func serveFirstEphemeral(name string) []string {
	return []string{"/bin/sh", "-c", `set -- $(cat /proc/sys/net/ipv4/ip_local_port_range) && exec /isotraffic serve --tcp :$1 --udp :$1 --name ` + name}
}

// firstEphemeral is the first port of id's ephemeral block (0 when the
// daemon does not know id yet).
func firstEphemeral(d *Daemon, id string) int {
	var c ctlContainer
	out, _, err := d.CtlResult("-o", "json", "get", id)
	if err != nil || json.Unmarshal([]byte(out), &c) != nil {
		return 0
	}
	return c.EphemeralPorts.Begin
}

// TestContainerdCtr: `ctr run --cni` foreground (--rm: ctr calls DEL when
// the task ends) and detached (-d: removing it with ctr task kill/rm and
// ctr containers rm never calls DEL; isolatord reclaims the orphan within
// its grace period). Both reachable from the sandbox client, labels shown,
// nothing left behind.
func TestContainerdCtr(t *testing.T) {
	needTools(t, "containerd", "ctr", "runc", "containerd-shim-runc-v2", "unshare")
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{Extra: []string{"--orphan-grace", orphanGrace.String()}})
	base := readHostState(t, sb, d.NetNSDir)
	c := startContainerd(t, sb.Name, d.Socket)
	rootfs := buildRootfs(t, runtimeDir(t, "ctr-rootfs"))

	// Foreground: ctr stays until the task ends, then DELs and removes it.
	fg := c.ctrCNICommand(append([]string{"run", "--cni", "--rm", "--rootfs", rootfs, "fg"}, serveFirstEphemeral("ctrfg")...)...)
	var fgOut strings.Builder
	fg.Stdout, fg.Stderr = &fgOut, &fgOut
	if err := fg.Start(); err != nil {
		t.Fatal(err)
	}
	fgDone := make(chan error, 1)
	go func() { fgDone <- fg.Wait() }()
	t.Cleanup(func() {
		fg.Process.Kill()
		if t.Failed() {
			t.Logf("ctr run (foreground) output:\n%s", fgOut.String())
		}
	})
	fgID := c.ns + "-fg"
	fgPort := 0
	wait.For(t, 30*time.Second, "foreground ctr container reachable on its first ephemeral port", func() bool {
		select {
		case err := <-fgDone:
			out := fgOut.String()
			if strings.Contains(out, "cgroup") || strings.Contains(out, "OCI runtime") {
				t.Skipf("containerd cannot run containers here: %v\n%s", err, out)
			}
			t.Fatalf("ctr run ended: %v\n%s\nisolatord:\n%s", err, out, d.Log())
		default:
		}
		if fgPort == 0 {
			fgPort = firstEphemeral(d, fgID)
		}
		s, err := echoFromClient(sb, "tcp", fgPort)
		return err == nil && s == "ctrfg"
	})
	mustEcho(t, sb, "udp", fgPort, "ctrfg")
	if out := d.Ctl(t, "get", fgID); !strings.Contains(out, "cni.network=isolator") {
		t.Errorf("isolatorctl get %s shows no CNI labels:\n%s", fgID, out)
	}
	if out, err := c.ctr("task", "kill", "-s", "SIGKILL", "fg"); err != nil {
		t.Fatalf("ctr task kill fg: %v\n%s", err, out)
	}
	select {
	case <-fgDone:
	case <-time.After(30 * time.Second):
		t.Fatal("foreground ctr run did not end after its task was killed")
	}
	if cg := cniGet(t, d, fgID); cg != nil {
		t.Errorf("ctr run --rm did not DEL %s: %v\n%s", fgID, cg, fgOut.String())
	}

	// Detached: ctr sets the network up and exits.
	if out, err := c.ctrCNI(append([]string{"run", "--cni", "-d", "--rootfs", rootfs, "bg"}, serveFirstEphemeral("ctrbg")...)...); err != nil {
		t.Fatalf("ctr run -d: %v\n%s\nisolatord:\n%s", err, out, d.Log())
	}
	bgID := c.ns + "-bg"
	bgPort := firstEphemeral(d, bgID)
	wait.For(t, 30*time.Second, "detached ctr container reachable on its first ephemeral port", func() bool {
		s, err := echoFromClient(sb, "tcp", bgPort)
		return err == nil && s == "ctrbg"
	})
	var list []ctlContainer
	d.CtlJSON(t, &list, "list", "--label", "cni.network=isolator")
	if len(list) != 1 || list[0].ContainerID != bgID {
		t.Errorf("list --label cni.network=isolator = %+v, want %s", list, bgID)
	}
	// Removed the ctr way: no DEL ever comes. The grace period starts when
	// the task's last process dies (the kill), not after the removal.
	removed := time.Now()
	for _, args := range [][]string{{"task", "kill", "-s", "SIGKILL", "bg"}, {"task", "rm", "-f", "bg"}, {"containers", "rm", "bg"}} {
		if out, err := c.ctr(args...); err != nil {
			t.Fatalf("ctr %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	took := waitGone(t, d, bgID, orphanGrace+20*time.Second)
	if el := time.Since(removed); el < orphanGrace {
		t.Errorf("reclaimed %v after the kill, within the %v grace period", el, orphanGrace)
	}
	t.Logf("detached ctr container removed without DEL: reclaimed after %v (grace %v)", took, orphanGrace)
	var st struct {
		OrphansReclaimed uint64 `json:"orphans_reclaimed"`
	}
	d.CtlJSON(t, &st, "status")
	if st.OrphansReclaimed != 1 {
		t.Errorf("orphans_reclaimed = %d, want 1", st.OrphansReclaimed)
	}
	if after := readHostState(t, sb, d.NetNSDir); fmt.Sprint(after) != fmt.Sprint(base) {
		t.Errorf("ctr containers left kernel state behind:\nbefore %+v\nafter  %+v", base, after)
	}
}
