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

	"google.golang.org/grpc"

	"github.com/isolatord/isolatord/api"
	pb "github.com/isolatord/isolatord/api/isolatord/v1"
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
// host namespace (nsenter --net, so its bind mounts stay visible).
type Daemon struct {
	t        testing.TB
	sb       *sandbox.Sandbox
	Dir      string // state, socket and netns dir live here
	Socket   string
	StateDir string
	NetNSDir string
	Args     []string
	// Wrap, when set, changes the command before each start (socket
	// activation tests run the daemon under a launcher).
	Wrap   func(d *Daemon, cmd *exec.Cmd)
	cmd    *exec.Cmd
	log    *bytes.Buffer
	mu     sync.Mutex
	conn   *grpc.ClientConn
	Client pb.IsolatorClient
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

// Start (re)starts the daemon process and waits for it to serve.
func (d *Daemon) Start() {
	d.t.Helper()
	bin := filepath.Join(Binaries(d.t), "isolatord")
	d.mu.Lock()
	d.log = &bytes.Buffer{}
	cmd := exec.Command("nsenter", append([]string{"--net=" + d.sb.Host.Path, "--", bin}, d.Args...)...)
	cmd.Stdout = d.log
	cmd.Stderr = d.log
	d.cmd = cmd
	d.mu.Unlock()
	if d.Wrap != nil {
		d.Wrap(d, cmd)
	}
	if err := cmd.Start(); err != nil {
		d.t.Fatalf("start isolatord: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-done:
			d.t.Fatalf("isolatord exited during start-up:\n%s", d.Log())
		default:
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("isolatord did not serve within 20s:\n%s", d.Log())
		}
		if strings.Contains(d.Log(), `"msg":"serving"`) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := api.Dial(ctx, d.Socket)
	if err != nil {
		d.t.Fatalf("dial: %v\n%s", err, d.Log())
	}
	d.conn = conn
	d.Client = pb.NewIsolatorClient(conn)
}

// Log returns what the daemon printed so far.
func (d *Daemon) Log() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.log == nil {
		return ""
	}
	return d.log.String()
}

// Pid of the running daemon process (nsenter execs it, so same pid).
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

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
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	if d.cmd.ProcessState == nil {
		_ = d.cmd.Process.Signal(sig)
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) {
			if err := syscall.Kill(d.cmd.Process.Pid, 0); err != nil {
				break
			}
			// Reap if it is our child and exited.
			var ws syscall.WaitStatus
			if pid, _ := syscall.Wait4(d.cmd.Process.Pid, &ws, syscall.WNOHANG, nil); pid == d.cmd.Process.Pid {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		_ = d.cmd.Process.Kill()
	}
	d.cmd = nil
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
