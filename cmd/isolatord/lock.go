package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// hostLock is the exclusive lock one daemon holds on a host network
// namespace for its whole life: an flock on <dir>/netns-<dev>-<ino>.lock,
// keyed to the namespace's nsfs device and inode, holding the holder's pid.
// It is taken before the state is read or the kernel touched, so a second
// daemon for the same namespace (whatever its --state-dir or --socket)
// changes nothing and names the holder. The kernel drops the lock when the
// process ends, kill -9 included; the file stays (removing it would let two
// daemons lock two different files of the same name).
type hostLock struct {
	f    *os.File
	path string
}

// errLocked: another live process holds the lock.
var errLocked = errors.New("another isolatord holds the lock")

// lockHostNS locks the host network namespace nsPath ("" = the daemon's own).
func lockHostNS(dir, nsPath string) (*hostLock, error) {
	if nsPath == "" {
		nsPath = "/proc/self/ns/net"
	}
	var st unix.Stat_t
	if err := unix.Stat(nsPath, &st); err != nil {
		return nil, fmt.Errorf("host network namespace %s: %w", nsPath, err)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("--lock-dir: %w", err)
	}
	path := filepath.Join(dir, fmt.Sprintf("netns-%d-%d.lock", st.Dev, st.Ino))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--lock-dir: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			b, _ := os.ReadFile(path)
			holder := strings.TrimSpace(string(b))
			if _, perr := strconv.Atoi(holder); perr != nil {
				holder = "unknown"
			}
			return nil, fmt.Errorf("%w: isolatord pid %s serves this host network namespace (net:[%d], lock %s); this one changed nothing", errLocked, holder, st.Ino, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("write pid to %s: %w", path, err)
		}
	}
	return &hostLock{f: f, path: path}, nil
}

// release drops the lock (the process ending does too).
func (l *hostLock) release() {
	if l != nil && l.f != nil {
		l.f.Close()
	}
}
