package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/isolatord/isolatord/test/wait"
)

// TestHelperOwner is not a test: TestDeadOwnerIsSwept runs the test binary
// with ISOT_SANDBOX_HELPER=1 to get a process that owns a sandbox and a
// container and then dies without cleaning up.
func TestHelperOwner(t *testing.T) {
	if os.Getenv("ISOT_SANDBOX_HELPER") != "1" {
		t.Skip("helper process for TestDeadOwnerIsSwept")
	}
	s, err := NewNamed("isotdead")
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	c, err := s.Spawn("holder")
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("owner", s.Name, c.Pid)
	time.Sleep(time.Minute) // killed long before
	os.Exit(1)
}

func TestDeadOwnerIsSwept(t *testing.T) {
	RequireRoot(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperOwner$", "-test.count=1")
	cmd.Env = append(os.Environ(), "ISOT_SANDBOX_HELPER=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var name string
	var ctrPid int
	sc := bufio.NewScanner(out)
	deadline := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
	defer deadline.Stop()
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && f[0] == "owner" {
			name = f[1]
			ctrPid, _ = strconv.Atoi(f[2])
			break
		}
		if len(f) > 0 && f[0] == "error" {
			t.Fatalf("helper: %s", sc.Text())
		}
	}
	if name == "" {
		t.Fatal("helper did not report its sandbox")
	}
	// Kill the owner the hard way: no cleanup runs.
	cmd.Process.Kill()
	cmd.Wait()
	// Its container dies with it (Pdeathsig)...
	if !wait.Until(2*time.Second, func() bool {
		return errors.Is(syscall.Kill(ctrPid, 0), syscall.ESRCH) || isZombie(ctrPid)
	}) {
		t.Errorf("container pid %d outlived its dead owner", ctrPid)
		syscall.Kill(ctrPid, syscall.SIGKILL)
	}
	// ...its namespaces are still there...
	for _, suf := range []string{"-host", "-client"} {
		if _, err := os.Stat(filepath.Join(NetnsDir, name+suf)); err != nil {
			t.Fatalf("expected the dead owner's %s%s to remain until a sweep: %v", name, suf, err)
		}
	}
	// ...until the next sandbox sweeps them.
	New(t)
	for _, suf := range []string{"-host", "-client"} {
		if _, err := os.Stat(filepath.Join(NetnsDir, name+suf)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s%s not swept: %v", name, suf, err)
		}
	}
	if _, err := os.Stat(filepath.Join(RegistryDir, name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("registry entry %s not removed: %v", name, err)
	}
}

// isZombie reports whether pid is a zombie (dead, parent has not reaped it:
// the container's parent, init, reaps it soon).
func isZombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && len(s) > i+2 && s[i+2] == 'Z'
}

func TestLiveOwnerIsNotSwept(t *testing.T) {
	a := New(t)
	New(t) // sweeps: a's owner (this process) is alive
	if left := a.Leftovers(); len(left) != 2 {
		t.Errorf("live sandbox %s lost namespaces to a sweep: %v", a.Name, left)
	}
}

func TestSysctlAndHolder(t *testing.T) {
	s := New(t)
	if v, err := s.Host.Sysctl("net.ipv4.ip_local_port_range"); err != nil || strings.Join(strings.Fields(v), " ") != HostPortRange {
		t.Errorf("host port range %q, %v", v, err)
	}
	c := s.StartContainer(t, "holder")
	if c.Exited() || !strings.Contains(strings.Join(c.Cmd.Args, " "), "sleep") {
		t.Fatalf("holder container: %v exited=%v", c.Cmd.Args, c.Exited())
	}
	if err := c.SetSysctl("net/ipv4/ip_local_port_range", "40000 40063"); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Sysctl("net.ipv4.ip_local_port_range"); err != nil || strings.Join(strings.Fields(v), " ") != "40000 40063" {
		t.Errorf("container port range %q, %v", v, err)
	}
	// Seen by a program in the container, not by the host.
	if out := strings.Fields(c.Run(t, "cat", "/proc/sys/net/ipv4/ip_local_port_range")); strings.Join(out, " ") != "40000 40063" {
		t.Errorf("container program sees %v", out)
	}
	if v, _ := s.Host.Sysctl("net.ipv4.ip_local_port_range"); strings.Join(strings.Fields(v), " ") != HostPortRange {
		t.Errorf("host port range changed to %q", v)
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(func() error { return nil }); err == nil {
		t.Error("Do in a stopped container succeeded")
	}
}

func TestIPNetnsExecWorks(t *testing.T) {
	s := New(t)
	b, err := exec.Command("ip", "netns", "exec", s.Host.Name, "ip", "-4", "-o", "addr", "show", "dev", "eth0").CombinedOutput()
	if err != nil || !strings.Contains(string(b), "198.18.0.1/24") {
		t.Errorf("ip netns exec %s: %v\n%s", s.Host.Name, err, b)
	}
}
