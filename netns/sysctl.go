package netns

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
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
	b, err := os.ReadFile(SysctlPath(name))
	if err != nil {
		return "", fmt.Errorf("read sysctl %s: %w", name, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// WriteSysctlHere writes a sysctl in the calling thread's namespace.
func WriteSysctlHere(name, value string) error {
	f, err := os.OpenFile(SysctlPath(name), os.O_WRONLY, 0)
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

// EnsureSysctlHere writes value only if the sysctl (in the calling thread's
// namespace) holds something else, and reports whether it wrote. Some
// network sysctls (forwarding, disable_ipv6) take the RTNL lock on write and
// spin (restart the syscall) while another task holds it; skipping writes
// that change nothing keeps them off that lock.
func EnsureSysctlHere(name, value string) (bool, error) {
	cur, err := ReadSysctlHere(name)
	if err != nil {
		return false, err
	}
	if normalizeSysctl(cur) == normalizeSysctl(value) {
		return false, nil
	}
	return true, WriteSysctlHere(name, value)
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
		for _, kv := range kvs {
			if err := WriteSysctlHere(kv.Name, kv.Value); err != nil {
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
		for _, name := range names {
			v, err := ReadSysctlHere(name)
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
		for _, kv := range kvs {
			old, err := ReadSysctlHere(kv.Name)
			if err != nil {
				return err
			}
			if normalizeSysctl(old) == normalizeSysctl(kv.Value) {
				continue
			}
			if err := WriteSysctlHere(kv.Name, kv.Value); err != nil {
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
