package netns

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// IPv6ConfDir is the directory /proc/sys/net/ipv6/conf of one namespace,
// held open so that a device's IPv6 settings are reached without looking
// up /proc/sys/net/ipv6 again. That lookup compares against every
// namespace's own "ipv6" entry (they share the /proc/sys/net dentry; see
// SysctlDir), so its cost grows with the number of namespaces on the
// machine; below the held directory, names are the namespace's own.
type IPv6ConfDir struct{ f *os.File }

// OpenIPv6ConfDirHere opens /proc/sys/net/ipv6/conf of the calling thread's
// namespace (use it inside NS.Do). A kernel without IPv6 gives (nil, nil).
func OpenIPv6ConfDirHere() (*IPv6ConfDir, error) {
	f, err := os.OpenFile("/proc/sys/net/ipv6/conf", os.O_RDONLY|unix.O_DIRECTORY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open /proc/sys/net/ipv6/conf: %w", err)
	}
	return &IPv6ConfDir{f: f}, nil
}

// DisableIPv6 turns IPv6 off for interface ifname of the directory's
// namespace, like DisableIPv6Here. Call it inside NS.Do of that namespace:
// the kernel shows /proc/sys entries only to threads of their namespace.
func (c *IPv6ConfDir) DisableIPv6(ifname string) error {
	name := ifname + "/disable_ipv6"
	fd, err := unix.Openat(int(c.f.Fd()), name, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("write sysctl net/ipv6/conf/%s=1: %w", name, &fs.PathError{Op: "openat", Path: name, Err: err})
	}
	f := os.NewFile(uintptr(fd), name)
	_, err = f.WriteString("1")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write sysctl net/ipv6/conf/%s=1: %w", name, err)
	}
	return nil
}

// Close releases the directory.
func (c *IPv6ConfDir) Close() error { return c.f.Close() }
