package sysctl

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// openPrivateSysNet opens sys/net of a private, detached procfs instance
// (fsopen/fsmount: a superblock of its own, attached to no mount table,
// gone when the returned directory is closed). Looking up net/ipv4,
// net/ipv6 or net/core below the ordinary /proc/sys/net compares the name
// against every namespace's own copy of that entry, all children of the one
// shared /proc/sys/net dentry, so its cost grows with the number of network
// namespaces on the machine (proc_sys_compare, each comparison under the
// global sysctl lock). Below a fresh instance's net directory the only
// copies are the ones this instance looked up: the calling thread's
// namespace's. The kernel still shows each thread its own namespace's
// entries. An error (no new mount API, no privilege) makes the caller use
// /proc/sys/net.
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
// rest of a private instance costs, and most of what a one-key Dir would
// take. Background closers take that wait off the caller; the kernel lets
// concurrent waiters share a grace period.
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
