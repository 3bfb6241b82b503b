package netns

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Sysctl is one sysctl, named by its path under /proc/sys
// (for example "net/ipv4/conf/lo/route_localnet").
type Sysctl struct {
	Name  string
	Value string
}

// SysctlPath is the /proc/sys file of a sysctl name. Names may use '/' or '.'
// as separator when they contain no interface name; prefer '/'.
func SysctlPath(name string) string {
	if !strings.Contains(name, "/") {
		name = strings.ReplaceAll(name, ".", "/")
	}
	return "/proc/sys/" + strings.TrimPrefix(name, "/")
}

// ReadSysctlHere reads a sysctl in the calling thread's namespace. Call it
// inside NS.Do (or from an ordinary goroutine for the process's namespace).
func ReadSysctlHere(name string) (string, error) {
	return SysctlDir{}.Read(name)
}

// WriteSysctlHere writes a sysctl in the calling thread's namespace.
func WriteSysctlHere(name, value string) error {
	return SysctlDir{}.Write(name, value)
}

// SysctlDir reads and writes sysctls of the calling thread's namespace,
// resolving names below /proc/sys/net/<first>/ relative to directories
// opened once per batch. The /proc/sys/net dentry is shared by all network
// namespaces, and each namespace has its own child dentries "ipv4", "ipv6",
// "core"... under it: all with the same parent and name, so a full-path
// lookup compares against every namespace's copy (proc_sys_compare shows up
// in profiles with 1,000 containers). Holding the namespace's own
// /proc/sys/net/<first> open pays that walk once per batch instead of once
// per file. The zero SysctlDir uses full paths.
type SysctlDir struct {
	net *os.File
	sub map[string]*os.File // first component under net/ -> its directory
}

// OpenSysctlDir opens /proc/sys/net of the calling thread's namespace; use
// it on that thread (inside NS.Do) and Close it before leaving. It is the
// net directory of a private procfs instance when the process may make one
// (openPrivateSysNet: the first lookup below it then costs the same however
// many namespaces the machine has), else /proc/sys/net.
func OpenSysctlDir() (SysctlDir, error) {
	f, err := openPrivateSysNet()
	if err != nil {
		if f, err = os.Open("/proc/sys/net"); err != nil {
			return SysctlDir{}, fmt.Errorf("open /proc/sys/net: %w", err)
		}
	}
	return SysctlDir{net: f, sub: map[string]*os.File{}}, nil
}

// Close releases the directories.
func (s SysctlDir) Close() error {
	if s.net == nil {
		return nil
	}
	for _, f := range s.sub {
		f.Close()
	}
	return s.net.Close()
}

func (s SysctlDir) open(name string, flag int) (*os.File, error) {
	p := SysctlPath(name)
	if s.net != nil {
		if rel, ok := strings.CutPrefix(p, "/proc/sys/net/"); ok {
			dirfd := int(s.net.Fd())
			if first, rest, ok := strings.Cut(rel, "/"); ok {
				d, found := s.sub[first]
				if !found {
					fd, err := unix.Openat(dirfd, first, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
					if err != nil {
						return nil, &fs.PathError{Op: "openat", Path: p, Err: err}
					}
					d = os.NewFile(uintptr(fd), "/proc/sys/net/"+first)
					s.sub[first] = d
				}
				dirfd, rel = int(d.Fd()), rest
			}
			fd, err := unix.Openat(dirfd, rel, flag|unix.O_CLOEXEC, 0)
			if err != nil {
				return nil, &fs.PathError{Op: "openat", Path: p, Err: err}
			}
			return os.NewFile(uintptr(fd), p), nil
		}
	}
	return os.OpenFile(p, flag, 0)
}

// Read reads one sysctl.
func (s SysctlDir) Read(name string) (string, error) {
	f, err := s.open(name, os.O_RDONLY)
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
func (s SysctlDir) Write(name, value string) error {
	f, err := s.open(name, os.O_WRONLY)
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

// Ensure writes value only if the sysctl holds something else (see
// EnsureSysctlHere) and reports whether it wrote.
func (s SysctlDir) Ensure(name, value string) (bool, error) {
	cur, err := s.Read(name)
	if err != nil {
		return false, err
	}
	if normalizeSysctl(cur) == normalizeSysctl(value) {
		return false, nil
	}
	return true, s.Write(name, value)
}

// EnsureSysctlHere writes value only if the sysctl (in the calling thread's
// namespace) holds something else, and reports whether it wrote. Some
// network sysctls (forwarding, disable_ipv6) take the RTNL lock on write and
// spin (restart the syscall) while another task holds it; skipping writes
// that change nothing keeps them off that lock.
func EnsureSysctlHere(name, value string) (bool, error) {
	return SysctlDir{}.Ensure(name, value)
}

// ReadSysctl reads one sysctl inside namespace n.
func (n *NS) ReadSysctl(name string) (string, error) {
	var v string
	err := n.Do(func() error {
		var err error
		v, err = ReadSysctlHere(name)
		return err
	})
	return v, err
}

// WriteSysctls writes the sysctls in order inside namespace n (one thread
// switch for all of them) and stops at the first error.
func (n *NS) WriteSysctls(kvs ...Sysctl) error {
	return n.Do(func() error {
		sd, err := OpenSysctlDir()
		if err != nil {
			return err
		}
		defer sd.Close()
		for _, kv := range kvs {
			if err := sd.Write(kv.Name, kv.Value); err != nil {
				return err
			}
		}
		return nil
	})
}

// ReadSysctls reads the named sysctls inside namespace n and returns those
// that exist, in the order asked; missing ones are skipped silently (a kernel
// may not have them).
func (n *NS) ReadSysctls(names ...string) ([]Sysctl, error) {
	var out []Sysctl
	err := n.Do(func() error {
		sd, err := OpenSysctlDir()
		if err != nil {
			return err
		}
		defer sd.Close()
		for _, name := range names {
			v, err := sd.Read(name)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return err
			}
			out = append(out, Sysctl{name, v})
		}
		return nil
	})
	return out, err
}

// SetSysctlsSaving writes the sysctls inside namespace n, first reading the
// current value of each one. It returns the values it found (in order) for
// each sysctl actually changed, so the caller can record or restore them.
// Sysctls already at the wanted value are not written and not returned.
func (n *NS) SetSysctlsSaving(kvs ...Sysctl) (changed []Sysctl, err error) {
	err = n.Do(func() error {
		sd, err := OpenSysctlDir()
		if err != nil {
			return err
		}
		defer sd.Close()
		for _, kv := range kvs {
			old, err := sd.Read(kv.Name)
			if err != nil {
				return err
			}
			if normalizeSysctl(old) == normalizeSysctl(kv.Value) {
				continue
			}
			if err := sd.Write(kv.Name, kv.Value); err != nil {
				return err
			}
			changed = append(changed, Sysctl{kv.Name, old})
		}
		return nil
	})
	return changed, err
}

// HostSysctlsToCopy are the namespaced sysctls whose host values are copied
// into every container (those a workload notices: listen backlog, ECN, TCP
// keepalive, buffers and retries). Missing ones are skipped.
var HostSysctlsToCopy = []string{
	"net/core/somaxconn",
	"net/ipv4/tcp_ecn",
	"net/ipv4/tcp_ecn_fallback",
	"net/ipv4/tcp_keepalive_time",
	"net/ipv4/tcp_keepalive_intvl",
	"net/ipv4/tcp_keepalive_probes",
	"net/ipv4/tcp_max_syn_backlog",
	"net/ipv4/tcp_rmem",
	"net/ipv4/tcp_wmem",
	"net/ipv4/tcp_retries2",
	"net/ipv4/tcp_synack_retries",
}

// normalizeSysctl folds whitespace so "61000\t61999" equals "61000 61999".
func normalizeSysctl(s string) string { return strings.Join(strings.Fields(s), " ") }
