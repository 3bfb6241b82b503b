package e2e

// Socket activation: systemd (packaging/isolatord.socket) holds isolatord's
// listening socket, so connections made while the daemon restarts wait in
// the socket's backlog instead of failing. These tests hold the socket the
// way systemd does (LISTEN_FDS/LISTEN_PID, fd 3) and run the real
// systemd-socket-activate.

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

// socketHolder plays systemd's part: it listens on the daemon's socket
// once, and passes it to every start of the daemon as fd 3 with LISTEN_FDS=1
// and LISTEN_PID set to the daemon's pid (sh sets it, then execs nsenter,
// which execs isolatord: one pid throughout).
type socketHolder struct {
	lis  *net.UnixListener
	file *os.File
}

func (h *socketHolder) wrap(t *testing.T) func(d *Daemon, cmd *exec.Cmd) {
	return func(d *Daemon, cmd *exec.Cmd) {
		if h.lis == nil {
			if err := os.MkdirAll(filepath.Dir(d.Socket), 0o750); err != nil {
				t.Fatal(err)
			}
			lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: d.Socket, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			f, err := lis.File()
			if err != nil {
				t.Fatal(err)
			}
			h.lis, h.file = lis, f
			t.Cleanup(func() { f.Close(); lis.Close() })
		}
		sh, err := exec.LookPath("sh")
		if err != nil {
			t.Skip("no sh")
		}
		cmd.Args = append([]string{"sh", "-c", `LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" "$@"`}, cmd.Args...)
		cmd.Path = sh
		cmd.ExtraFiles = []*os.File{h.file}
	}
}

// pending is the number of connections waiting in the accept queue of the
// listening unix socket at path (ss's Recv-Q of a listening socket).
func pending(t *testing.T, path string) int {
	out, err := exec.Command("ss", "-xlnH").Output()
	if err != nil {
		t.Fatalf("ss -xl: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		// Netid State Recv-Q Send-Q Local-Address Port Peer...
		if len(f) >= 5 && f[4] == path {
			n, _ := strconv.Atoi(f[2])
			return n
		}
	}
	return 0
}

// TestSocketActivationRestartIsInvisible: with the socket held across a
// restart, CHECK and DEL issued while isolatord is down wait in the backlog
// and succeed once it is back; the daemon never removes the socket it was
// given.
func TestSocketActivationRestartIsInvisible(t *testing.T) {
	if _, err := exec.LookPath("ss"); err != nil {
		t.Skip("needs ss (iproute2)")
	}
	sb := sandbox.New(t)
	var holder socketHolder
	d := StartDaemon(t, sb, DaemonOptions{Wrap: holder.wrap(t)})
	if !strings.Contains(d.Log(), "socket activation") {
		t.Fatalf("the daemon did not take the passed socket:\n%s", d.Log())
	}
	nw := newCNINet(t, Binaries(t), d.Socket, "isolator", "1.0.0", "")
	ctx := cniCtx(t)
	web := startServer(t, sb, "web", 31001)
	id := sb.Name + "-web"
	rt := cniRuntime(id, web.NetNS, cniPortMappings(31001))
	if _, err := nw.CNI.AddNetworkList(ctx, nw.List, rt); err != nil {
		t.Fatalf("ADD: %v\n%s", err, d.Log())
	}
	mustEcho(t, sb, "tcp", 31001, "web")

	for _, verb := range []string{"CHECK", "DEL"} {
		d.Stop()
		if _, err := os.Stat(d.Socket); err != nil {
			t.Fatalf("the daemon removed the socket it was passed: %v", err)
		}
		done := make(chan error, 1)
		go func() {
			if verb == "CHECK" {
				done <- nw.CNI.CheckNetworkList(ctx, nw.List, rt)
			} else {
				done <- nw.CNI.DelNetworkList(ctx, nw.List, rt)
			}
		}()
		// The plugin's connection waits in the backlog while nobody serves.
		if !wait.Until(10*time.Second, func() bool {
			select {
			case err := <-done:
				t.Fatalf("%s returned while isolatord was down: %v", verb, err)
			default:
			}
			return pending(t, d.Socket) > 0
		}) {
			t.Fatalf("%s: no connection queued on %s within 10s", verb, d.Socket)
		}
		d.Start()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s issued while isolatord restarted: %v\n%s", verb, err, d.Log())
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not finish within 30s of the restart", verb)
		}
		if verb == "CHECK" {
			mustEcho(t, sb, "tcp", 31001, "web")
		}
	}
	if c := cniGet(t, d, id); c != nil {
		t.Errorf("DEL during the restart left %s: %v", id, c)
	}
}

// TestSystemdSocketActivate: under systemd-socket-activate (what a .socket
// unit does) the daemon starts on the first connection and serves the
// socket it was passed.
func TestSystemdSocketActivate(t *testing.T) {
	tool, err := exec.LookPath("systemd-socket-activate")
	if err != nil {
		t.Skip("systemd-socket-activate not installed (package systemd)")
	}
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{Wrap: func(d *Daemon, cmd *exec.Cmd) {
		if err := os.MkdirAll(filepath.Dir(d.Socket), 0o750); err != nil {
			t.Fatal(err)
		}
		os.Remove(d.Socket)
		cmd.Args = append([]string{tool, "-l", d.Socket, "--"}, cmd.Args...)
		cmd.Path = tool
		// The first connection starts the daemon.
		go func() {
			wait.Until(20*time.Second, func() bool {
				c, err := net.Dial("unix", d.Socket)
				if err == nil {
					c.Close()
				}
				return err == nil
			})
		}()
	}})
	if !strings.Contains(d.Log(), "socket activation") {
		t.Fatalf("the daemon did not take the socket systemd-socket-activate passed:\n%s", d.Log())
	}
	if out := d.Ctl(t, "status"); !strings.Contains(out, "Orphans reclaimed") {
		t.Errorf("status:\n%s", out)
	}
}
