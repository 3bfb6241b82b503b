// Package nshandle holds network namespaces as open handles: it opens them
// by pid or path (or creates an anonymous one), compares them by inode, runs
// code inside one on a locked OS thread (NS.Do), and opens netlink handles
// whose sockets live in one (NS.Netlink). It is tested against real
// namespaces (root; the tests skip otherwise).
//
// Design notes:
//
//   - Namespaces are held as open file descriptors (NS). Identity is the
//     (device, inode) pair of the nsfs file, never a pid or a path.
//   - Code that must run inside a namespace (sysctls under /proc/sys/net are
//     resolved against the namespace of the calling thread) runs through
//     NS.Do, which uses a fresh goroutine locked to its OS thread. If the
//     thread cannot be moved back to its original namespace, the goroutine
//     exits still locked so that the Go runtime destroys the thread instead
//     of reusing a thread in the wrong namespace.
//   - Netlink work uses netlink.NewHandleAt handles, whose sockets live in the
//     target namespace and can then be used from any goroutine. An open handle
//     (like an open NS) keeps its namespace alive, so callers must close both.
//   - Nothing here ever execs ip or tc.
package nshandle

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"strconv"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NS is an open handle on a network namespace. The zero value is not usable;
// get one from Open, OpenPid or Current. An open NS keeps the namespace alive.
type NS struct {
	f    *os.File
	path string
	dev  uint64
	ino  uint64
}

// Open opens the network namespace file at path (for example
// /proc/PID/ns/net or /var/run/netns/NAME) and checks that it really is a
// network namespace.
func Open(path string) (*NS, error) {
	f, err := openFile(path)
	if err != nil {
		return nil, fmt.Errorf("open network namespace %s: %w", path, err)
	}
	n, err := fromFile(f, path)
	if err != nil {
		f.Close()
		return nil, err
	}
	return n, nil
}

// openFile opens path read-only. os.Open would first try to add the
// descriptor to the runtime's poller, four fcntl and epoll_ctl calls that
// fail for nsfs and procfs files; a setup opens namespace files several
// times.
func openFile(path string) (*os.File, error) {
	fd, err := openFd(path)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// openFd opens path read-only (close-on-exec) and returns the descriptor.
func openFd(path string) (int, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, &fs.PathError{Op: "open", Path: path, Err: err}
		}
		return fd, nil
	}
}

// OpenPid opens the network namespace of process pid.
func OpenPid(pid int) (*NS, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("open network namespace: invalid pid %d", pid)
	}
	return Open("/proc/" + strconv.Itoa(pid) + "/ns/net")
}

// Current opens the network namespace of the calling thread, which for any
// goroutine not inside NS.Do is the process's own namespace.
func Current() (*NS, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return Open("/proc/thread-self/ns/net")
}

func fromFile(f *os.File, path string) (*NS, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("stat network namespace %s: %w", path, err)
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &sfs); err != nil {
		return nil, fmt.Errorf("statfs network namespace %s: %w", path, err)
	}
	if sfs.Type != unix.NSFS_MAGIC {
		return nil, fmt.Errorf("%s is not a network namespace (not an nsfs file)", path)
	}
	// NS_GET_NSTYPE tells the namespace type; only accept network namespaces.
	t, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE)
	if err == nil && t != unix.CLONE_NEWNET {
		return nil, fmt.Errorf("%s is not a network namespace", path)
	}
	return &NS{f: f, path: path, dev: uint64(st.Dev), ino: st.Ino}, nil
}

// Path is the path the namespace was opened from.
func (n *NS) Path() string { return n.path }

// Fd is the open namespace file descriptor (valid until Close).
func (n *NS) Fd() int { return int(n.f.Fd()) }

// Ino is the namespace's inode number (what `ls -iL /proc/PID/ns/net` shows).
func (n *NS) Ino() uint64 { return n.ino }

// Dev is the device number of the nsfs file.
func (n *NS) Dev() uint64 { return n.dev }

// SameAs reports whether n and o are the same namespace.
func (n *NS) SameAs(o *NS) bool { return n != nil && o != nil && n.dev == o.dev && n.ino == o.ino }

// String names the namespace by path and inode.
func (n *NS) String() string { return fmt.Sprintf("%s(net:[%d])", n.path, n.ino) }

// Close releases the handle. The namespace itself lives on while anything
// else (a process, a bind mount, a socket) references it.
func (n *NS) Close() error {
	if n == nil || n.f == nil {
		return nil
	}
	err := n.f.Close()
	n.f = nil
	return err
}

// Netlink opens a netlink handle whose sockets live in this namespace. The
// handle can be used from any goroutine; close it when done (it keeps the
// namespace alive).
func (n *NS) Netlink() (*netlink.Handle, error) {
	h, err := netlink.NewHandleAt(netns.NsHandle(n.Fd()))
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", n, err)
	}
	return h, nil
}

// errRestore marks the failure to move a thread back to its namespace.
var errRestore = errors.New("cannot restore the thread's network namespace")

// Do runs fn on an OS thread that is inside namespace n, then moves the
// thread back. fn must not start goroutines that expect to be in n (they
// would run on other threads). If the thread cannot be moved back, it is
// never unlocked, so the runtime terminates it when the goroutine ends.
// A panic in fn is turned into an error.
func (n *NS) Do(fn func() error) error {
	if n == nil || n.f == nil {
		return errors.New("nshandle: Do on a closed namespace")
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := openFd("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open current network namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := unix.Setns(n.Fd(), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter %s: %w", n, err)
			return
		}
		ferr := runInNS(fn)
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked: it dies with this goroutine.
			errc <- errors.Join(ferr, fmt.Errorf("%w: %v", errRestore, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func runInNS(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic inside namespace: %v", r)
		}
	}()
	return fn()
}

// New creates a fresh, anonymous network namespace (only lo, down) and
// returns a handle on it; the namespace lives exactly as long as something
// references it (this handle, a netlink handle, a bind mount, a process).
// The calling thread is not moved: the unshare happens on a throwaway
// locked thread that goes back to its namespace (or dies).
func New() (*NS, error) {
	type res struct {
		ns  *NS
		err error
	}
	c := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := openFd("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			c <- res{nil, fmt.Errorf("open current network namespace: %w", err)}
			return
		}
		defer unix.Close(orig)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			c <- res{nil, fmt.Errorf("unshare network namespace: %w", err)}
			return
		}
		ns, err := Open("/proc/thread-self/ns/net")
		if rerr := unix.Setns(orig, unix.CLONE_NEWNET); rerr != nil {
			if ns != nil {
				ns.Close()
			}
			c <- res{nil, fmt.Errorf("%w: %v", errRestore, rerr)} // thread stays locked and dies
			return
		}
		runtime.UnlockOSThread()
		c <- res{ns, err}
	}()
	r := <-c
	return r.ns, r.err
}
