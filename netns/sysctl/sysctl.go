// Package sysctl reads and writes the sysctls of a network namespace. Dir is
// the one way in: In(ns, fn) runs fn on a thread inside ns with a Dir of that
// namespace; code that already runs inside a namespace (in nshandle.NS.Do)
// uses Here(fn), or Open to hold the Dir of the calling thread's namespace
// across calls. A Dir reads and writes by key, a path under /proc/sys
// ("net/ipv4/conf/lo/route_localnet"; '.' separators are accepted when the
// key names no interface), and sets per-device IPv4 settings over netlink
// (SetIPv4Conf).
//
// Why a Dir, not full paths: /proc/sys/net's dentry is shared by all network
// namespaces, and each namespace has its own child dentries "ipv4", "ipv6",
// "core"... under it: all with the same parent and name, so a full-path
// lookup compares against every copy of every namespace that ever looked
// that name up there (proc_sys_compare, under the global sysctl lock, in
// the one dcache hash chain of (net, name): with 1,000 containers it was a
// quarter of a container's configuration). A Dir never walks it: from its
// first key below net/ it holds the net directory of a private procfs
// instance (privateproc.go), whose only dentries are those of the few
// namespaces whose Dirs shared that instance, and the namespace's own
// net/<first> directories below it. Only where the process cannot make an
// instance (no new mount API, no privilege) does it hold /proc/sys/net
// instead and pay the walk once per net/<first> directory.
//
// The tests run in scratch namespaces as root (they skip otherwise) and check
// that nothing leaks into the process's own namespace.
package sysctl

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/nshandle"
)

// Setting is one sysctl key and its value.
type Setting struct {
	Name  string
	Value string
}

// Dir reads and writes the sysctls of the namespace of the threads that use
// it. Use it only on threads of one namespace (inside its NS.Do): the kernel
// resolves entries under /proc/sys/net against the calling thread's
// namespace. A Dir may be kept open and used by several goroutines at once.
type Dir struct {
	mu  sync.Mutex
	net *sysNet             // the held net directory, from the first key below net/ on
	sub map[string]*os.File // first component under net/ -> its directory
}

// Open returns a Dir for the namespace of the calling thread (call it
// inside NS.Do, or from an ordinary goroutine for the process's namespace).
// It opens nothing yet. Close the Dir when done.
func Open() *Dir { return &Dir{sub: map[string]*os.File{}} }

// In runs fn on a thread inside ns with a Dir of ns, closed when fn returns.
func In(ns *nshandle.NS, fn func(*Dir) error) error {
	return ns.Do(func() error { return Here(fn) })
}

// Here runs fn with a Dir of the calling thread's namespace, closed when fn
// returns (call it inside NS.Do, or from an ordinary goroutine for the
// process's namespace).
func Here(fn func(*Dir) error) error {
	d := Open()
	defer d.Close()
	return fn(d)
}

// Close releases the directories.
func (d *Dir) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, f := range d.sub {
		f.Close()
	}
	d.sub = nil
	if d.net != nil {
		d.net.release()
		d.net = nil
	}
	return nil
}

// path is the /proc/sys file of a key.
func path(name string) string {
	if !strings.Contains(name, "/") {
		name = strings.ReplaceAll(name, ".", "/")
	}
	return "/proc/sys/" + strings.TrimPrefix(name, "/")
}

// netDir returns the held net directory, acquired at the first key below
// net/: a private procfs instance's (shared with a few other Dirs), else
// /proc/sys/net.
func (d *Dir) netDir() (*os.File, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.net == nil {
		n, err := acquireSysNet()
		if err != nil {
			return nil, err
		}
		d.net = n
	}
	return d.net.dir, nil
}

// subdir is the held directory net/first, opened on first use.
func (d *Dir) subdir(first string) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if f, ok := d.sub[first]; ok {
		return int(f.Fd()), nil
	}
	fd, err := unix.Openat(int(d.net.dir.Fd()), first, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	d.sub[first] = os.NewFile(uintptr(fd), "/proc/sys/net/"+first)
	return fd, nil
}

func (d *Dir) open(name string, flag int) (*os.File, error) {
	p := path(name)
	rel, ok := strings.CutPrefix(p, "/proc/sys/net/")
	if !ok {
		return os.OpenFile(p, flag, 0)
	}
	net, err := d.netDir()
	if err != nil {
		return nil, err
	}
	dirfd := int(net.Fd())
	if first, rest, ok := strings.Cut(rel, "/"); ok {
		fd, err := d.subdir(first)
		if err != nil {
			return nil, &fs.PathError{Op: "openat", Path: p, Err: err}
		}
		dirfd, rel = fd, rest
	}
	fd, err := unix.Openat(dirfd, rel, flag|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "openat", Path: p, Err: err}
	}
	return os.NewFile(uintptr(fd), p), nil
}

// Read reads one sysctl.
func (d *Dir) Read(name string) (string, error) {
	f, err := d.open(name, os.O_RDONLY)
	if err != nil {
		return "", fmt.Errorf("read sysctl %s: %w", name, err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return "", fmt.Errorf("read sysctl %s: %w", name, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Write writes one sysctl.
func (d *Dir) Write(name, value string) error {
	f, err := d.open(name, os.O_WRONLY)
	if err != nil {
		return fmt.Errorf("write sysctl %s=%q: %w", name, value, err)
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write sysctl %s=%q: %w", name, value, err)
	}
	return nil
}

// ReadExisting reads the named sysctls and returns those that exist, in the
// order asked; missing ones are skipped silently (a kernel may not have them).
func (d *Dir) ReadExisting(names ...string) ([]Setting, error) {
	var out []Setting
	for _, name := range names {
		v, err := d.Read(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return out, err
		}
		out = append(out, Setting{name, v})
	}
	return out, nil
}

// SetSaving writes the sysctls in order, first reading the current value of
// each one, and stops at the first error. It returns the values it found
// for each sysctl actually changed, so the caller can record or restore
// them. Sysctls already at the wanted value (whitespace aside) are not
// written and not returned: some (forwarding, disable_ipv6) take the RTNL
// lock on write and spin while another task holds it.
func (d *Dir) SetSaving(kvs ...Setting) (changed []Setting, err error) {
	for _, kv := range kvs {
		old, err := d.Read(kv.Name)
		if err != nil {
			return changed, err
		}
		if normalize(old) == normalize(kv.Value) {
			continue
		}
		if err := d.Write(kv.Name, kv.Value); err != nil {
			return changed, err
		}
		changed = append(changed, Setting{kv.Name, old})
	}
	return changed, nil
}

// DisableIPv6 turns IPv6 off for interface ifname ("all" for every one). A
// kernel without IPv6 is fine.
func (d *Dir) DisableIPv6(ifname string) error {
	err := d.Write("net/ipv6/conf/"+ifname+"/disable_ipv6", "1")
	if err != nil && errors.Is(err, fs.ErrNotExist) && !d.HasIPv6() {
		return nil
	}
	return err
}

// allDisableIPv6 turns IPv6 off (1) or on (0) for every device.
const allDisableIPv6 = "net/ipv6/conf/all/disable_ipv6"

// SetAllDisableIPv6 writes net/ipv6/conf/all/disable_ipv6, which the
// kernel also writes to "default" and every device (addrconf_disable_ipv6),
// unless all of them already hold value: that write takes the rtnl lock,
// even when it changes nothing, and spins (restarting the write) while
// another task holds it, a link deletion say. It reads "all" first and
// writes at the first entry that differs, so it costs one read more than
// a write when something has to change.
func (d *Dir) SetAllDisableIPv6(value string) error {
	same, err := d.allHold("net/ipv6/conf", "disable_ipv6", value)
	if err != nil || same {
		return err
	}
	return d.Write(allDisableIPv6, value)
}

// allHold reports whether dir/<entry>/key holds value for every entry of
// dir, "all" first.
func (d *Dir) allHold(dir, key, value string) (bool, error) {
	if v, err := d.Read(dir + "/all/" + key); err != nil || normalize(v) != normalize(value) {
		return false, err
	}
	f, err := d.open(dir, os.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return false, fmt.Errorf("read sysctl directory %s: %w", dir, err)
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return false, fmt.Errorf("read sysctl directory %s: %w", dir, err)
	}
	for _, n := range names {
		v, err := d.Read(dir + "/" + n + "/" + key)
		if errors.Is(err, fs.ErrNotExist) {
			continue // a device gone meanwhile
		}
		if err != nil || normalize(v) != normalize(value) {
			return false, err
		}
	}
	return true, nil
}

// HasIPv6 reports whether the kernel has IPv6 (net/ipv6/conf exists).
func (d *Dir) HasIPv6() bool {
	_, err := d.Read(allDisableIPv6)
	return err == nil
}

// normalize folds whitespace so "61000\t61999" equals "61000 61999".
func normalize(s string) string { return strings.Join(strings.Fields(s), " ") }
