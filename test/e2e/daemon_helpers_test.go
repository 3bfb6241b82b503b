package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/isolatord/isolatord/api"
	pbgrpc "github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"
	"github.com/isolatord/isolatord/test/daemonproc"
	"github.com/isolatord/isolatord/test/sandbox"
)

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// TestMain removes the binaries built for this test process.
func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// Binaries builds isolatord, isolatorctl and isolator-cni once per test
// process and returns the directory holding them.
func Binaries(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "isolatord-e2e-bin-")
		if buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", buildDir+"/", "./cmd/...")
		cmd.Dir = repoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/...: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildDir
}

func repoRoot() string {
	wd, _ := os.Getwd()
	for d := wd; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
	}
	return wd
}

// Daemon is an isolatord process running with its host side in a sandbox's
// host namespace (test/daemonproc: nsenter --net, so its bind mounts stay
// visible), with a gRPC client of it.
type Daemon struct {
	t        testing.TB
	sb       *sandbox.Sandbox
	proc     *daemonproc.Process
	Dir      string // state, socket and netns dir live here
	Socket   string
	StateDir string
	NetNSDir string
	Args     []string
	// Wrap, when set, changes the command before each start (socket
	// activation tests run the daemon under a launcher).
	Wrap   func(d *Daemon, cmd *exec.Cmd)
	conn   *api.Client
	Client pbgrpc.IsolatorClient
}

// DaemonOptions tune StartDaemon.
type DaemonOptions struct {
	Ports, Ephemeral string
	BlockSize        int
	Extra            []string
	Wrap             func(d *Daemon, cmd *exec.Cmd) // see Daemon.Wrap
	// NetNSDir, when set, is the daemon's --netns-dir instead of one of
	// its own: a shared directory such as /var/run/netns, which cleanup
	// then leaves alone (the test removes what it made there).
	NetNSDir string
}

// StartDaemon starts isolatord for sb and waits until it serves.
func StartDaemon(t testing.TB, sb *sandbox.Sandbox, o DaemonOptions) *Daemon {
	t.Helper()
	if o.Ports == "" {
		o.Ports = "31000-31999"
	}
	if o.Ephemeral == "" {
		o.Ephemeral = "32768-40959"
	}
	if o.BlockSize == 0 {
		o.BlockSize = 256
	}
	dir := t.TempDir()
	d := &Daemon{t: t, sb: sb, Dir: dir,
		Socket:   filepath.Join(dir, "run", "isolatord.sock"),
		StateDir: filepath.Join(dir, "state"),
		NetNSDir: filepath.Join(dir, "netns"),
		Wrap:     o.Wrap,
	}
	sharedDir := o.NetNSDir != ""
	if sharedDir {
		d.NetNSDir = o.NetNSDir
	}
	d.Args = append([]string{
		"--socket", d.Socket, "--state-dir", d.StateDir, "--netns-dir", d.NetNSDir,
		// the per-host-namespace lock file under the test's directory,
		// not /run/isolatord (the sandbox host namespace is the key)
		"--lock-dir", filepath.Join(dir, "lock"),
		"--ports", o.Ports, "--ephemeral-ports", o.Ephemeral,
		"--ephemeral-ports-per-container", fmt.Sprint(o.BlockSize),
		"--metrics-addr", "", "--log-level", "debug",
	}, o.Extra...)
	t.Cleanup(func() {
		d.Stop()
		if t.Failed() {
			t.Logf("isolatord log:\n%s", d.Log())
		}
		if sharedDir {
			return // other processes' pins live there: never sweep it
		}
		// The netns dir is a mount point with our bind mounts inside:
		// detach whatever is left so the temp dir can go.
		if ents, err := os.ReadDir(d.NetNSDir); err == nil {
			for _, e := range ents {
				_ = syscall.Unmount(filepath.Join(d.NetNSDir, e.Name()), syscall.MNT_DETACH)
			}
		}
		_ = syscall.Unmount(d.NetNSDir, syscall.MNT_DETACH)
	})
	d.Start()
	return d
}

// Start (re)starts the daemon process with d.Args and waits for it to
// serve, then dials it.
func (d *Daemon) Start() {
	d.t.Helper()
	if d.proc == nil {
		d.proc = &daemonproc.Process{Bin: filepath.Join(Binaries(d.t), "isolatord"), HostNS: d.sb.Host.Path}
	}
	d.proc.Args = d.Args
	d.proc.Wrap = nil
	if d.Wrap != nil {
		d.proc.Wrap = func(cmd *exec.Cmd) { d.Wrap(d, cmd) }
	}
	if _, err := d.proc.Start(20 * time.Second); err != nil {
		d.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := api.Dial(ctx, d.Socket)
	if err != nil {
		d.t.Fatalf("dial: %v\n%s", err, d.Log())
	}
	d.conn = conn
	d.Client = conn
}

// Log returns what the daemon printed so far.
func (d *Daemon) Log() string {
	if d.proc == nil {
		return ""
	}
	return d.proc.Log()
}

// Pid of the running daemon process (nsenter execs it, so same pid), 0
// when it is not running.
func (d *Daemon) Pid() int { return d.proc.Pid() }

// Exited is closed once the daemon process has exited.
func (d *Daemon) Exited() <-chan struct{} { return d.proc.Done() }

// Kill sends SIGKILL and waits for the process to go.
func (d *Daemon) Kill() {
	d.stopWith(syscall.SIGKILL)
}

// Stop sends SIGTERM (graceful) and waits.
func (d *Daemon) Stop() {
	d.stopWith(syscall.SIGTERM)
}

func (d *Daemon) stopWith(sig syscall.Signal) {
	if d.conn != nil {
		d.conn.Close()
		d.conn = nil
	}
	if d.proc == nil {
		return
	}
	if err := d.proc.Stop(sig); err != nil {
		d.t.Logf("stop isolatord: %v", err)
	}
}

// Ctl runs isolatorctl against the daemon and returns stdout; it fails the
// test on a non-zero exit unless wantFail.
func (d *Daemon) Ctl(t testing.TB, args ...string) string {
	t.Helper()
	out, errOut, err := d.CtlResult(args...)
	if err != nil {
		t.Fatalf("isolatorctl %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// CtlResult runs isolatorctl and returns stdout, stderr and the exit error.
func (d *Daemon) CtlResult(args ...string) (string, string, error) {
	cmd := exec.Command(filepath.Join(Binaries(d.t), "isolatorctl"), append([]string{"--socket", d.Socket}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String(), errOut.String(), err
}

// CtlJSON runs isolatorctl -o json and decodes its output into v.
func (d *Daemon) CtlJSON(t testing.TB, v any, args ...string) {
	t.Helper()
	out := d.Ctl(t, append([]string{"-o", "json"}, args...)...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("isolatorctl %v: bad JSON %q: %v", args, out, err)
	}
}

// ctlContainer is isolatorctl's JSON for one container.
type ctlContainer struct {
	ContainerID    string `json:"container_id"`
	State          string `json:"state"`
	EphemeralPorts struct {
		Begin, End int
	} `json:"ephemeral_ports"`
	Ports []struct {
		Begin, End int
		Shared     bool
	} `json:"ports"`
	Veth  string `json:"veth"`
	Netns string `json:"netns"`
}
