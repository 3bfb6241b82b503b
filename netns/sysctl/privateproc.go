package sysctl

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// sysNet is a net directory Dirs hold: sys/net of a private procfs
// instance, shared by the Dirs of up to instanceUses namespaces, or
// /proc/sys/net where no instance can be made (one per Dir).
type sysNet struct {
	dir  *os.File
	refs int // Dirs holding it
	uses int // Dirs that have held it
}

// instanceUses bounds how many Dirs (namespaces) share one instance. Each
// namespace a Dir works in leaves its own "ipv4", "ipv6", "core" entries
// below the instance's net directory, all in the one dcache hash chain of
// their name, which every later lookup of that name walks: the bound keeps
// that walk short, and making and closing an instance (about 0.2 ms of CPU
// time) is paid once per instanceUses Dirs.
const instanceUses = 32

// instances hands out the current shared instance.
var instances struct {
	sync.Mutex
	cur *sysNet
}

// acquireSysNet returns a net directory for a Dir, to give back with
// release: the current shared instance's, a new one when it has served
// instanceUses Dirs.
func acquireSysNet() (*sysNet, error) {
	instances.Lock()
	defer instances.Unlock()
	if cur := instances.cur; cur != nil && cur.uses >= instanceUses {
		instances.cur = nil
		if cur.refs == 0 {
			go cur.dir.Close() // the instance goes with its last descriptor
		}
	}
	if instances.cur == nil {
		f, err := openPrivateSysNet()
		if err != nil {
			if f, err = os.Open("/proc/sys/net"); err != nil {
				return nil, err
			}
			return &sysNet{dir: f, refs: 1, uses: 1}, nil
		}
		instances.cur = &sysNet{dir: f}
	}
	instances.cur.refs++
	instances.cur.uses++
	return instances.cur, nil
}

// release gives a net directory back; it is closed once no Dir holds it
// and it is not the current shared instance.
func (s *sysNet) release() {
	instances.Lock()
	defer instances.Unlock()
	s.refs--
	if s.refs == 0 && s != instances.cur {
		go s.dir.Close()
	}
}

// openPrivateSysNet opens sys/net of a private, detached procfs instance
// (fsopen/fsmount: a superblock of its own, attached to no mount table,
// gone when the returned directory and every file opened below it are
// closed). Looking up net/ipv4, net/ipv6 or net/core below the ordinary
// /proc/sys/net compares the name against every namespace's own copy of
// that entry, all children of the one shared /proc/sys/net dentry, so its
// cost grows with the number of network namespaces on the machine
// (proc_sys_compare, each comparison under the global sysctl lock). Below
// a fresh instance's net directory the only copies are the ones looked up
// through this instance. The kernel still shows each thread its own
// namespace's entries. An error (no new mount API, no privilege) makes
// the caller use /proc/sys/net.
func openPrivateSysNet() (*os.File, error) {
	fs, err := unix.Fsopen("proc", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("fsopen proc: %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigCreate(fs); err != nil {
		return nil, fmt.Errorf("create proc instance: %w", err)
	}
	mnt, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return nil, fmt.Errorf("fsmount proc: %w", err)
	}
	// The open directory keeps the detached mount alive; closing it
	// releases the instance.
	defer closeMountLater(mnt)
	fd, err := unix.Openat(mnt, "sys/net", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open sys/net of a proc instance: %w", err)
	}
	return os.NewFile(uintptr(fd), "/proc/sys/net"), nil
}

// Closing the descriptor of a detached mount unmounts it, and an unmount
// waits for an RCU grace period: about a millisecond, eight times what the
// rest of a private instance costs. Background closers take that wait off
// the caller; the kernel lets concurrent waiters share a grace period.
const mountClosers = 4

var (
	mountsToClose = make(chan int, 256)
	startClosers  sync.Once
)

// closeMountLater closes the mount descriptor fd in the background (at
// once, here, when the closers are that far behind).
func closeMountLater(fd int) {
	startClosers.Do(func() {
		for range mountClosers {
			go func() {
				for fd := range mountsToClose {
					unix.Close(fd)
				}
			}()
		}
	})
	select {
	case mountsToClose <- fd:
	default:
		unix.Close(fd)
	}
}
