package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/nspin"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

// orphanGrace is the --orphan-grace of the orphan tests: short, so that the
// tests are quick, long enough to see that nothing happens before it.
const orphanGrace = 2 * time.Second

// waitGone waits until the daemon no longer knows id.
func waitGone(t *testing.T, d *Daemon, id string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var err error
	if !wait.Until(within, func() bool {
		_, err = d.Client.Get(context.Background(), &pb.GetRequest{ContainerId: id})
		return err != nil && strings.Contains(err.Error(), "not known")
	}) {
		t.Fatalf("%s still known %v after its namespace was orphaned (err %v)", id, within, err)
	}
	return time.Since(start)
}

// pinAt bind-mounts the namespace at nsPath on a new file in dir, as a
// runtime pins a container's namespace (podman /run/netns/netns-*, CRI
// /run/netns/cni-*).
func pinAt(t *testing.T, nsPath, dir, name string) string {
	t.Helper()
	ns, err := nshandle.Open(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	p, err := nspin.BindMount(ns, dir, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nspin.Unmount(dir, name) })
	return p
}

// TestOrphanReclaimed: a container whose runtime went away without Cleanup
// (its process killed, no pin but isolatord's own) is cleaned up after the
// grace period and counted (status and metric), leaving nothing in the
// host namespace; its ports and ID are free again. A container with a live
// process, and one whose namespace a runtime still pins, are never
// reclaimed; once the runtime's pin goes, that one is reclaimed too.
func TestOrphanReclaimed(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{Extra: []string{"--orphan-grace", orphanGrace.String()}})
	base := readHostState(t, sb, d.NetNSDir)

	runtimeDir := filepath.Join(t.TempDir(), "runtime-netns")
	if err := os.MkdirAll(runtimeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	gone, live, pinned := sb.Name+"-gone", sb.Name+"-live", sb.Name+"-pinned"
	cg := startServer(t, sb, "gone", 31001)
	cl := startServer(t, sb, "live", 31002)
	cp := startServer(t, sb, "pinned", 31003)
	runtimePin := pinAt(t, cp.NetNS, runtimeDir, "netns-pinned")

	d.Ctl(t, "prepare", gone, "--ports", "31001")
	d.Ctl(t, "prepare", live, "--ports", "31002")
	d.Ctl(t, "prepare", pinned, "--ports", "31003")
	d.Ctl(t, "isolate", gone, "--netns", cg.NetNS)
	d.Ctl(t, "isolate", live, "--pid", strconv.Itoa(cl.Pid))
	d.Ctl(t, "isolate", pinned, "--netns", cp.NetNS)
	mustEcho(t, sb, "tcp", 31001, "gone")
	mustEcho(t, sb, "tcp", 31003, "pinned")

	killed := time.Now()
	if err := cg.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := cp.Stop(); err != nil {
		t.Fatal(err)
	}
	took := waitGone(t, d, gone, orphanGrace+15*time.Second)
	if el := time.Since(killed); el < orphanGrace {
		t.Errorf("%s reclaimed %v after its process died, before the %v grace period", gone, el, orphanGrace)
	}
	t.Logf("orphan reclaimed %v after its last process died (grace %v)", took, orphanGrace)

	// The pinned one has been orphaned-but-pinned as long: still there.
	var got ctlContainer
	d.CtlJSON(t, &got, "get", pinned)
	if got.State != "isolated" {
		t.Fatalf("%s (pinned by its runtime) was touched: %+v", pinned, got)
	}
	d.CtlJSON(t, &got, "get", live)
	if got.State != "isolated" {
		t.Fatalf("%s (live process) was touched: %+v", live, got)
	}
	mustEcho(t, sb, "tcp", 31002, "live")

	var st struct {
		OrphansReclaimed uint64 `json:"orphans_reclaimed"`
	}
	d.CtlJSON(t, &st, "status")
	if st.OrphansReclaimed != 1 {
		t.Errorf("status orphans_reclaimed = %d, want 1", st.OrphansReclaimed)
	}
	if !strings.Contains(d.Log(), "reclaimed orphaned container") || !strings.Contains(d.Log(), gone) {
		t.Errorf("no log line for the reclaimed orphan")
	}
	// Its port and ID are free again.
	d.Ctl(t, "prepare", gone, "--ports", "31001")
	d.Ctl(t, "cleanup", gone)

	// The runtime removes its pin: now only isolatord's own is left.
	if err := unix.Unmount(runtimePin, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	waitGone(t, d, pinned, orphanGrace+15*time.Second)
	d.CtlJSON(t, &st, "status")
	if st.OrphansReclaimed != 2 {
		t.Errorf("status orphans_reclaimed = %d, want 2", st.OrphansReclaimed)
	}

	d.Ctl(t, "cleanup", live)
	if after := readHostState(t, sb, d.NetNSDir); fmt.Sprint(after) != fmt.Sprint(base) {
		t.Errorf("reclamation left kernel state behind:\nbefore %+v\nafter  %+v", base, after)
	}
}

// TestOrphanThreadKeepsNamespace: a namespace entered by one thread of a
// process (the process itself elsewhere) is in use: never reclaimed.
func TestOrphanThreadKeepsNamespace(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{Extra: []string{"--orphan-grace", orphanGrace.String()}})
	id := sb.Name + "-thread"
	c := startServer(t, sb, "thread", 31004)
	d.Ctl(t, "prepare", id, "--ports", "31004")
	d.Ctl(t, "isolate", id, "--netns", c.NetNS)

	// A thread of this test process enters the namespace through
	// isolatord's pin and stays there while the container's process dies.
	entered, release := make(chan error, 1), make(chan struct{})
	go func() {
		err := sandbox.DoInNetNS(filepath.Join(d.NetNSDir, id), func() error {
			entered <- nil
			<-release
			return nil
		})
		if err != nil {
			entered <- err
		}
	}()
	if err := <-entered; err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(); err != nil {
		close(release)
		t.Fatal(err)
	}
	// Three grace periods: it would have been reclaimed long since. The
	// passing time is what is under test (no reclaim while a thread is in
	// the namespace), so this loop watches for the whole of it.
	deadline := time.Now().Add(3 * orphanGrace)
	for time.Now().Before(deadline) {
		if _, _, err := d.CtlResult("get", id); err != nil {
			close(release)
			t.Fatalf("%s reclaimed while a thread was in its namespace: %v", id, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	close(release)
	waitGone(t, d, id, orphanGrace+15*time.Second)
}
