package e2e

// A real Nomad 1.6.0 agent (MPL-2.0; server and client in one, inside the
// sandbox host namespace) drives isolator-cni through `network { mode =
// "cni/isolator" }` with raw_exec tasks. Not part of `make test`: building
// Nomad takes minutes. `make test-nomad` builds it (scripts/build-nomad.sh)
// and runs this with NOMAD_BIN set. Nomad 1.7.0 and later are under the
// Business Source License: the test refuses to run them.
//
// isolatord runs with --netns-dir /var/run/netns, Nomad's own pin
// directory, so the alloc namespace pins clash exactly as in production.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/netns/nspin"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

// nomadVersionRe finds the version in `nomad version` ("Nomad v1.6.0").
var nomadVersionRe = regexp.MustCompile(`Nomad v(\d+)\.(\d+)\.(\d+)`)

// checkNomadVersion logs bin's `nomad version` line (run in the sandbox
// host namespace hostNS, like the agent) and refuses a Nomad under the
// Business Source License (1.7.0 and later).
func checkNomadVersion(t *testing.T, bin, hostNS string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+hostNS, "--", bin, "version")
	cmd.Env = nomadEnv()
	b, err := cmd.CombinedOutput()
	out := strings.TrimSpace(string(b))
	if err != nil {
		t.Fatalf("%s version: %v\n%s", bin, err, out)
	}
	t.Logf("nomad version: %s", strings.ReplaceAll(out, "\n", "; "))
	m := nomadVersionRe.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("%s version: no \"Nomad vX.Y.Z\" in %q", bin, out)
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	if major > 1 || major == 1 && minor >= 7 {
		t.Fatalf("%s is Nomad %s.%s.%s: Nomad 1.7.0 and later are under the Business Source License, "+
			"which this project does not run; use Nomad 1.6.0 (MPL-2.0, scripts/build-nomad.sh)", bin, m[1], m[2], m[3])
	}
}

// holdsPort reports whether c holds port, shared or exclusively as asked.
func holdsPort(c *pb.Container, port uint32, shared bool) bool {
	for _, p := range c.GetPorts() {
		if p.GetBegin() <= port && port <= p.GetEnd() && p.GetShared() == shared {
			return true
		}
	}
	return false
}

type nomadAgent struct {
	t      *testing.T
	bin    string
	hostNS string
	conf   string
	mu     sync.Mutex
	log    bytes.Buffer // every run's output
	cmd    *exec.Cmd
	done   chan struct{}
	allocs map[string]bool // every alloc ID runningAllocs has seen
}

// nomadEnv is the agent's environment: without AWS_CA_BUNDLE (with it
// some Nomad versions die at start setting up their IMDS client) and
// without the caller's NOMAD_* settings.
func nomadEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AWS_CA_BUNDLE=") && !strings.HasPrefix(kv, "NOMAD_") {
			env = append(env, kv)
		}
	}
	return append(env, "NOMAD_ADDR=http://127.0.0.1:4646")
}

func (n *nomadAgent) Write(p []byte) (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.log.Write(p)
}

func (n *nomadAgent) Log() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.log.String()
}

func (n *nomadAgent) start() {
	n.t.Helper()
	cmd := exec.Command("nsenter", "--net="+n.hostNS, "--", n.bin, "agent", "-config", n.conf)
	cmd.Env = nomadEnv()
	cmd.Stdout, cmd.Stderr = n, n
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	n.cmd, n.done = cmd, make(chan struct{})
	go func(done chan struct{}) { cmd.Wait(); close(done) }(n.done)
	wait.For(n.t, 90*time.Second, "Nomad node ready", func() bool {
		out, err := n.cli("node", "status")
		return err == nil && strings.Contains(out, "ready")
	})
}

// stop sends SIGINT (Nomad's graceful shutdown; allocs keep running) and
// waits for the process.
func (n *nomadAgent) stop() {
	if n.cmd == nil {
		return
	}
	n.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-n.done:
	case <-time.After(30 * time.Second):
		n.cmd.Process.Kill()
		<-n.done
	}
	n.cmd = nil
}

// cli runs the nomad CLI in the sandbox host namespace.
func (n *nomadAgent) cli(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + n.hostNS, "--", n.bin}, args...)...)
	cmd.Env = nomadEnv()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (n *nomadAgent) mustCLI(args ...string) string {
	n.t.Helper()
	out, err := n.cli(args...)
	if err != nil {
		n.t.Fatalf("nomad %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// runningAllocs lists the full IDs of job's running allocations.
func (n *nomadAgent) runningAllocs(job string) []string {
	out, err := n.cli("job", "allocs", "-t", `{{range .}}{{if eq .ClientStatus "running"}}{{.ID}} {{end}}{{end}}`, job)
	if err != nil {
		return nil
	}
	ids := strings.Fields(out)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.allocs == nil {
		n.allocs = map[string]bool{}
	}
	for _, id := range ids {
		n.allocs[id] = true
	}
	return ids
}

// leftPins lists the namespace pins Nomad made for this test's allocs
// that still exist.
func (n *nomadAgent) leftPins() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var left []string
	for id := range n.allocs {
		p := filepath.Join(nspin.DefaultDir, id)
		if _, err := os.Lstat(p); err == nil {
			left = append(left, p)
		}
	}
	return left
}

// cleanup stops the jobs, gives Nomad time to tear their allocs down
// (DEL, then it unmounts its pins), stops the agent and, should the test
// have stopped it before that, removes the pins of this test's allocs
// that Nomad left.
func (n *nomadAgent) cleanup(jobs ...string) {
	for _, job := range jobs {
		n.cli("job", "stop", "-detach", "-purge", job)
	}
	if n.cmd != nil {
		wait.Until(60*time.Second, func() bool { return len(n.leftPins()) == 0 })
	}
	n.stop()
	for _, p := range n.leftPins() {
		n.t.Logf("removing the pin Nomad left: %s", p)
		unix.Unmount(p, unix.MNT_DETACH)
		os.Remove(p)
	}
}

// TestNomad: static-port job reachable from outside through Nomad's own
// pin, isolatord kill -9 keeps traffic flowing, a Nomad restart while
// isolatord is down keeps the alloc running, job stop leaves nothing and
// no `postrun failed` in Nomad's log; a shared port spreads connections
// over a group's allocations.
func TestNomad(t *testing.T) {
	bin := os.Getenv("NOMAD_BIN")
	if bin == "" {
		t.Skip("set NOMAD_BIN to a Nomad 1.6.0 agent (make test-nomad builds one)")
	}
	needTools(t)
	sb := sandbox.New(t)
	checkNomadVersion(t, bin, sb.Host.Path)
	d := StartDaemon(t, sb, DaemonOptions{NetNSDir: nspin.DefaultDir})
	base := readHostState(t, sb, filepath.Join(t.TempDir(), "none"))

	dir := runtimeDir(t, "nomad")
	cniDir, cniBin := filepath.Join(dir, "cni"), filepath.Join(dir, "cni-bin")
	os.MkdirAll(cniDir, 0o755)
	os.MkdirAll(cniBin, 0o755)
	// Only the plugin: Nomad runs every binary in cni_path to fingerprint it.
	copyFile(t, filepath.Join(Binaries(t), "isolator-cni"), filepath.Join(cniBin, "isolator-cni"))
	for _, name := range []string{"isolator.conflist", "isolator-shared.conflist"} {
		b, err := os.ReadFile(filepath.Join(repoRoot(), "packaging", "cni", "nomad", name))
		if err != nil {
			t.Fatal(err)
		}
		conf := strings.Replace(string(b), `"/run/isolatord/isolatord.sock"`, `"`+d.Socket+`"`, 1)
		os.WriteFile(filepath.Join(cniDir, name), []byte(conf), 0o644)
	}
	agentConf := filepath.Join(dir, "agent.hcl")
	os.WriteFile(agentConf, []byte(fmt.Sprintf(`
data_dir  = %q
bind_addr = "127.0.0.1"
disable_update_check = true
advertise {
  http = "127.0.0.1"
  rpc  = "127.0.0.1"
  serf = "127.0.0.1"
}
server {
  enabled          = true
  bootstrap_expect = 1
}
client {
  enabled           = true
  network_interface = "eth0"
  cni_path          = %q
  cni_config_dir    = %q
  min_dynamic_port  = 31000
  max_dynamic_port  = 31999
  options {
    "fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean"
  }
}
plugin "raw_exec" {
  config {
    enabled = true
  }
}
`, filepath.Join(dir, "data"), cniBin, cniDir)), 0o644)
	n := &nomadAgent{t: t, bin: bin, hostNS: sb.Host.Path, conf: agentConf}
	t.Cleanup(func() {
		n.cleanup("static", "shared")
		if t.Failed() {
			t.Logf("nomad log (tail):\n%s", tail(n.Log(), 60))
		}
	})
	n.start()
	// The shipped example job is one this Nomad accepts.
	n.mustCLI("job", "validate", filepath.Join(repoRoot(), "packaging", "cni", "nomad", "web.nomad.hcl"))

	iso := staticIsotraffic(t)
	job := filepath.Join(dir, "static.nomad.hcl")
	os.WriteFile(job, []byte(fmt.Sprintf(`
job "static" {
  datacenters = ["*"]
  group "web" {
    network {
      mode = "cni/isolator"
      port "http" { static = 31005 }
    }
    task "server" {
      driver = "raw_exec"
      config {
        command = %q
        args    = ["serve", "--tcp", ":31005", "--udp", ":31005", "--name", "nomadweb"]
      }
    }
  }
}
`, iso)), 0o644)
	n.mustCLI("job", "run", "-detach", job)
	var allocs []string
	wait.For(t, 90*time.Second, "static job's alloc running", func() bool {
		allocs = n.runningAllocs("static")
		return len(allocs) == 1
	})
	alloc := allocs[0]
	wait.For(t, 30*time.Second, "static job reachable on 31005", func() bool {
		s, err := echoFromClient(sb, "tcp", 31005)
		return err == nil && s == "nomadweb"
	})
	// Nomad 1.6 passes no CNI_ARGS: the alloc is known by its CNI
	// container ID, the alloc ID, and isolatord uses Nomad's pin at
	// /var/run/netns/<allocID> without owning it. (Nomad 1.10 and later
	// add NOMAD_ALLOC_ID and friends to CNI_ARGS; the plugin copies them
	// into labels.)
	out := d.Ctl(t, "get", alloc)
	c := cniGet(t, d, alloc)
	if c == nil || c.GetNetns() != filepath.Join(nspin.DefaultDir, alloc) || c.GetPinOwned() ||
		!strings.Contains(out, "the runtime's pin") || !holdsPort(c, 31005, false) {
		t.Errorf("isolatorctl get %s:\n%s", alloc, out)
	}
	if id, ok := c.GetLabels()["cni.arg.NOMAD_ALLOC_ID"]; ok && id != alloc {
		t.Errorf("alloc %s labelled NOMAD_ALLOC_ID=%s", alloc, id)
	}

	// isolatord kill -9: traffic keeps flowing, and it comes back.
	d.Kill()
	mustEcho(t, sb, "tcp", 31005, "nomadweb")
	d.Start()

	// Nomad restarted while isolatord is down: the alloc keeps running.
	d.Stop()
	n.stop()
	n.start()
	d.Start()
	wait.For(t, 60*time.Second, "the alloc running after Nomad's restart", func() bool {
		a := n.runningAllocs("static")
		return len(a) == 1 && a[0] == alloc
	})
	mustEcho(t, sb, "tcp", 31005, "nomadweb")

	n.mustCLI("job", "stop", "-detach", "-purge", "static")
	wait.For(t, 60*time.Second, "isolatord forgets the stopped alloc", func() bool {
		return cniGet(t, d, alloc) == nil
	})
	wait.For(t, 30*time.Second, "Nomad removes its pin", func() bool {
		_, err := os.Stat(filepath.Join(nspin.DefaultDir, alloc))
		return os.IsNotExist(err)
	})
	if strings.Contains(n.Log(), "postrun failed") {
		t.Errorf("Nomad logged postrun failed:\n%s", tail(n.Log(), 30))
	}

	// A shared port: two allocations of one group on this node hold 31443
	// shared, their servers bind it with SO_REUSEPORT, and new connections
	// reach both. Nomad 1.6 has neither ignore_collision nor `cni { args }`
	// (both 1.9): the port is not declared to Nomad's scheduler, and the
	// network "isolator-shared" (packaging/cni/nomad/isolator-shared.conflist)
	// asks for it as shared.
	shared := filepath.Join(dir, "shared.nomad.hcl")
	os.WriteFile(shared, []byte(fmt.Sprintf(`
job "shared" {
  datacenters = ["*"]
  group "quic" {
    count = 2
    network {
      mode = "cni/isolator-shared"
    }
    task "server" {
      driver = "raw_exec"
      config {
        command = %q
        args    = ["serve", "--tcp", ":31443", "--reuseport", "--name", "alloc-${NOMAD_ALLOC_INDEX}"]
      }
    }
  }
}
`, iso)), 0o644)
	n.mustCLI("job", "run", "-detach", shared)
	wait.For(t, 90*time.Second, "shared job's two allocs running", func() bool {
		return len(n.runningAllocs("shared")) == 2
	})
	seen := map[string]int{}
	wait.For(t, 60*time.Second, "connections to 31443 reach both allocations", func() bool {
		if s, err := echoFromClient(sb, "tcp", 31443); err == nil {
			seen[s]++
		}
		return len(seen) == 2
	})
	t.Logf("shared port 31443 spread: %v", seen)
	sharedAllocs := n.runningAllocs("shared")
	for _, a := range sharedAllocs {
		if c := cniGet(t, d, a); c == nil || !holdsPort(c, 31443, true) {
			t.Errorf("alloc %s does not hold 31443 shared: %v", a, c)
		}
	}
	n.mustCLI("job", "stop", "-detach", "-purge", "shared")
	wait.For(t, 60*time.Second, "isolatord forgets the shared job's allocs", func() bool {
		for _, a := range sharedAllocs {
			if cniGet(t, d, a) != nil {
				return false
			}
		}
		return true
	})
	if strings.Contains(n.Log(), "postrun failed") {
		t.Errorf("Nomad logged postrun failed:\n%s", tail(n.Log(), 30))
	}

	after := readHostState(t, sb, filepath.Join(t.TempDir(), "none"))
	if fmt.Sprint(after) != fmt.Sprint(base) {
		t.Errorf("job stop left kernel state behind:\nbefore %+v\nafter  %+v", base, after)
	}
}
