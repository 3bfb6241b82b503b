package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetnsDir is where named network namespaces live, as `ip netns` expects.
const NetnsDir = "/run/netns"

// NS is a named network namespace bind-mounted at Path (/run/netns/<Name>).
type NS struct {
	Name string // name as listed by `ip netns list`
	Path string // /run/netns/<Name>
}

// Do runs fn on a locked OS thread switched into the namespace n and switches
// the thread back afterwards. See DoInNetNS.
func (n NS) Do(fn func() error) error { return DoInNetNS(n.Path, fn) }

// Netlink returns a netlink handle whose sockets live in n. The caller closes it
// with Delete().
func (n NS) Netlink() (*netlink.Handle, error) { return netlinkAt(n.Path) }

// Command returns `nsenter --net=<Path> -- name args...`: name runs in n and
// shares everything else (mount namespace included) with the caller.
func (n NS) Command(name string, args ...string) *exec.Cmd { return nsenterCmd(n.Path, name, args...) }

// Run runs name args... in n, fails the test with the output if it fails, and
// returns the combined output.
func (n NS) Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	return runCmd(t, n.Command(name, args...))
}

func nsenterCmd(path, name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=" + path, "--", name}, args...)...)
}

func runCmd(t testing.TB, cmd *exec.Cmd) string {
	t.Helper()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	return string(out)
}

func netlinkAt(path string) (*netlink.Handle, error) {
	h, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", path, err)
	}
	defer h.Close()
	return netlinkAtFd(h, path)
}

func netlinkAtFd(h netns.NsHandle, path string) (*netlink.Handle, error) {
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", path, err)
	}
	return nl, nil
}

// errGoexit reports that fn ended its goroutine (t.FailNow / runtime.Goexit).
var errGoexit = errors.New("sandbox: function run in a namespace called runtime.Goexit (t.FailNow/t.Fatal?); use t.Error or return an error")

// DoInNetNS runs fn in the network namespace at nsPath (a /run/netns file or
// /proc/<pid>/ns/net). fn runs in a fresh goroutine locked to its OS thread;
// the thread is switched into the namespace, then back into the namespace it
// was in. If switching back fails the thread is never unlocked, so the Go
// runtime destroys it when the goroutine ends and no other goroutine can ever
// run in the wrong namespace. Goroutines that fn starts run in the original
// namespace; sockets fn opens stay in the target namespace. A panic in fn is
// re-raised in the caller.
func DoInNetNS(nsPath string, fn func() error) error {
	target, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", nsPath, err)
	}
	defer unix.Close(target)
	return doInNetNSFd(target, nsPath, fn)
}

// doInNetNSFd is DoInNetNS for an open namespace fd; label names it in errors.
func doInNetNSFd(target int, nsPath string, fn func() error) error {
	type result struct {
		err      error
		panicked bool
		pval     any
	}
	done := make(chan result, 1)
	go func() {
		res := result{err: errGoexit}
		defer func() { done <- res }()
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			res.err = fmt.Errorf("open current netns: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			res.err = fmt.Errorf("setns %s: %w", nsPath, err)
			return
		}
		defer func() {
			if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
				// Leave the thread locked: it dies with this goroutine.
				if res.err == nil || res.err == errGoexit {
					res.err = fmt.Errorf("setns back from %s: %w", nsPath, err)
				}
				return
			}
			runtime.UnlockOSThread()
		}()
		defer func() {
			if p := recover(); p != nil {
				res.panicked, res.pval = true, p
				res.err = nil
			}
		}()
		res.err = fn()
	}()
	r := <-done
	if r.panicked {
		panic(r.pval)
	}
	return r.err
}

// ensureNetnsDir makes /run/netns a shared mount point, as `ip netns add`
// does, so that a namespace bind-mounted here is unmounted everywhere when it
// is deleted (and a later `ip netns add` cannot hide our mounts under a new
// bind of the directory).
func ensureNetnsDir() error {
	if err := os.MkdirAll(NetnsDir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("make %s shared: %w", NetnsDir, err)
	}
	// Not a mount point yet: bind it onto itself first.
	if err := unix.Mount(NetnsDir, NetnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", NetnsDir, err)
	}
	if err := unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", NetnsDir, err)
	}
	return nil
}

// createNamedNS creates a new network namespace and bind-mounts it at
// /run/netns/<name>, like `ip netns add <name>` (after ensureNetnsDir).
func createNamedNS(name string) (NS, error) { return CreateNSAt(NetnsDir, name) }

// CreateNSAt creates a new network namespace held by a bind mount on
// dir/name and no process. The calling thread is not changed: the work
// happens on a throwaway locked thread. NS.Delete removes it.
func CreateNSAt(dir, name string) (NS, error) {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return NS{}, fmt.Errorf("invalid netns name %q", name)
	}
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return NS{}, fmt.Errorf("create %s: %w", path, err)
	}
	f.Close()

	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open current netns: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare netns: %w", err)
			return
		}
		mountErr := unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, "")
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			// Thread stays locked and dies with this goroutine.
			errc <- fmt.Errorf("setns back after creating %s: %w", name, err)
			return
		}
		runtime.UnlockOSThread()
		if mountErr != nil {
			mountErr = fmt.Errorf("bind-mount netns at %s: %w", path, mountErr)
		}
		errc <- mountErr
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return NS{}, err
	}
	return NS{Name: name, Path: path}, nil
}

// deleteNamedNS unmounts and removes /run/netns/<name>, like `ip netns del`.
func deleteNamedNS(n NS) error { return n.Delete() }

// Delete unmounts and removes the namespace's file. The namespace (and its
// veths) goes away once no process or fd holds it.
func (n NS) Delete() error {
	if n.Path == "" {
		return nil
	}
	var firstErr error
	// Unmount every stacked mount (bounded), then remove the file.
	for i := 0; i < 8; i++ {
		if err := unix.Unmount(n.Path, unix.MNT_DETACH); err != nil {
			if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) && firstErr == nil {
				firstErr = fmt.Errorf("unmount %s: %w", n.Path, err)
			}
			break
		}
	}
	if err := os.Remove(n.Path); err != nil && !errors.Is(err, os.ErrNotExist) && firstErr == nil {
		firstErr = fmt.Errorf("remove %s: %w", n.Path, err)
	}
	return firstErr
}
