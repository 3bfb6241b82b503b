package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
)

// capBits are the bit numbers of the capabilities the unit may name
// (linux/capability.h).
var capBits = map[string]uint{
	"CAP_DAC_OVERRIDE": 1, "CAP_DAC_READ_SEARCH": 2, "CAP_KILL": 5,
	"CAP_NET_BIND_SERVICE": 10, "CAP_NET_BROADCAST": 11, "CAP_NET_ADMIN": 12, "CAP_NET_RAW": 13,
	"CAP_SYS_PTRACE": 19, "CAP_SYS_ADMIN": 21, "CAP_SYS_RESOURCE": 24,
	"CAP_PERFMON": 38, "CAP_BPF": 39,
}

// TestHardenedCapabilities runs isolatord the way packaging/isolatord.service
// does, short of its system call filter (that needs systemd): with only the
// unit's CapabilityBoundingSet, no new privileges and UMask=0077 (setpriv
// and the shell's umask). A container then goes through its life: prepare,
// isolate by pid (setns through /proc/PID/ns of a process with more
// capabilities), traffic, usage, a restart (recovery adopts it), cleanup; its
// pin is a mount our mount namespace sees, and the socket keeps its modes.
func TestHardenedCapabilities(t *testing.T) {
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv not installed (package util-linux)")
	}
	unit, err := os.ReadFile(filepath.Join(repoRoot(), "packaging", "isolatord.service"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CapabilityBoundingSet=(.+)$`).FindSubmatch(unit)
	if m == nil {
		t.Fatal("packaging/isolatord.service has no CapabilityBoundingSet=")
	}
	var want uint64
	var set []string
	for _, c := range strings.Fields(string(m[1])) {
		bit, ok := capBits[c]
		if !ok {
			t.Fatalf("CapabilityBoundingSet names %s, unknown to this test", c)
		}
		want |= 1 << bit
		set = append(set, "+"+strings.ToLower(strings.TrimPrefix(c, "CAP_")))
	}
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{Wrap: func(d *Daemon, cmd *exec.Cmd) {
		cmd.Args = append([]string{setpriv, "--no-new-privs", "--bounding-set", "-all," + strings.Join(set, ","),
			"--", "/bin/sh", "-c", `umask 077; exec "$@"`, "sh"}, cmd.Args...)
		cmd.Path = setpriv
	}})
	checkCaps := func() {
		t.Helper()
		b, err := os.ReadFile("/proc/" + strconv.Itoa(d.Pid()) + "/status")
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"CapEff", "CapBnd"} {
			m := regexp.MustCompile(`(?m)^` + f + `:\s+([0-9a-f]+)$`).FindSubmatch(b)
			if m == nil {
				t.Fatalf("no %s in /proc/PID/status", f)
			}
			if got, _ := strconv.ParseUint(string(m[1]), 16, 64); got != want {
				t.Fatalf("isolatord runs with %s %x, want the unit's %x", f, got, want)
			}
		}
		if !regexp.MustCompile(`(?m)^NoNewPrivs:\s+1$`).Match(b) {
			t.Fatal("isolatord runs without no_new_privs")
		}
	}
	checkCaps()
	for path, mode := range map[string]os.FileMode{d.Socket: 0o660, filepath.Dir(d.Socket): 0o750} {
		if st, err := os.Stat(path); err != nil || st.Mode().Perm() != mode {
			t.Errorf("%s under UMask=0077: %v %v, want mode %o", path, st.Mode(), err, mode)
		}
	}

	c := startServer(t, sb, "web", 31001)
	id := sb.Name + "-hard"
	d.Ctl(t, "prepare", id, "--ports", "31001")
	d.Ctl(t, "isolate", id, "--pid", strconv.Itoa(c.Pid))
	mustEcho(t, sb, "tcp", 31001, "web")
	mustEcho(t, sb, "udp", 31001, "web")
	d.Ctl(t, "usage", id)
	var got struct {
		Netns string `json:"netns"`
	}
	if err := json.Unmarshal([]byte(d.Ctl(t, "-o", "json", "get", id)), &got); err != nil {
		t.Fatal(err)
	}
	pin, err := nshandle.Open(got.Netns)
	if err != nil {
		t.Fatalf("the pin %q is not visible in our mount namespace: %v", got.Netns, err)
	}
	theirs, err := nshandle.Open(c.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	if !pin.SameAs(theirs) {
		t.Errorf("pin %s is not the container's namespace", got.Netns)
	}
	pin.Close()
	theirs.Close()

	// A host service's port is refused naming its holder: sock_diag, then
	// /proc/PID/fd (a directory of mode 0500) of a process with more
	// capabilities than isolatord's (SYS_PTRACE), and of one of another
	// user (DAC_READ_SEARCH too).
	svc := sb.StartHostProcess(t, "ready", traffic.BinaryPath(t), "serve", "--tcp", sb.HostIP.String()+":31005", "--name", "hostsvc")
	nobodyBin := filepath.Join(t.TempDir(), "isotraffic")
	if b, err := os.ReadFile(traffic.BinaryPath(t)); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(nobodyBin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(nobodyBin), 0o755); err != nil {
		t.Fatal(err)
	}
	nobody := sb.StartHostProcess(t, "ready", setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
		nobodyBin, "serve", "--tcp", sb.HostIP.String()+":31006", "--name", "nobody")
	for port, pid := range map[string]int{"31005": svc.Pid, "31006": nobody.Pid} {
		holder := "isotraffic (pid " + strconv.Itoa(pid) + ")"
		if _, stderr, err := d.CtlResult("prepare", id+"-x", "--ports", port); err == nil || !strings.Contains(stderr, holder) {
			t.Errorf("prepare of a host service's port %s: %v, %q; want the holder %s named", port, err, stderr, holder)
		}
	}

	d.Kill()
	d.Start()
	checkCaps()
	mustEcho(t, sb, "tcp", 31001, "web")
	d.Ctl(t, "cleanup", id)
	if _, err := echoFromClient(sb, "tcp", 31001); err == nil {
		t.Error("traffic still reaches the container after cleanup")
	}
	if l := strings.ToLower(d.Log()); strings.Contains(l, "operation not permitted") || strings.Contains(l, "permission denied") {
		t.Errorf("isolatord was refused an operation under the unit's capabilities:\n%s", d.Log())
	}
}
