package netns

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"testing"
)

func TestIPv6ConfDir(t *testing.T) {
	s := scratch(t)
	before, _ := ReadSysctlHere("net/ipv6/conf/lo/disable_ipv6")
	var c *IPv6ConfDir
	if err := s.Do(func() (err error) { c, err = OpenIPv6ConfDirHere(); return err }); err != nil {
		t.Fatal(err)
	}
	if c == nil {
		t.Skip("no IPv6 in this kernel")
	}
	defer c.Close()
	err := s.Do(func() error {
		if err := c.DisableIPv6("lo"); err != nil {
			return err
		}
		if v, err := ReadSysctlHere("net/ipv6/conf/lo/disable_ipv6"); err != nil || v != "1" {
			return fmt.Errorf("lo disable_ipv6 read back %q %v", v, err)
		}
		if err := c.DisableIPv6("nope0"); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("missing device: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The write happened in the scratch namespace only.
	if v, _ := ReadSysctlHere("net/ipv6/conf/lo/disable_ipv6"); v != before {
		t.Fatalf("the write leaked into the process's namespace: lo disable_ipv6 %q, was %q", v, before)
	}
}

// The private procfs instance shows the calling thread's namespace, like
// /proc/sys does: a write through it is read back by the full path there.
func TestPrivateSysNet(t *testing.T) {
	s := scratch(t)
	err := s.Do(func() error {
		f, err := openPrivateSysNet()
		if err != nil {
			return err
		}
		sd := SysctlDir{net: f, sub: map[string]*os.File{}}
		defer sd.Close()
		if err := sd.Write("net/ipv4/ip_local_port_range", "42000 42999"); err != nil {
			return err
		}
		if v, err := ReadSysctlHere("net/ipv4/ip_local_port_range"); err != nil || normalizeSysctl(v) != "42000 42999" {
			return fmt.Errorf("read back by the full path: %q %v", v, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := ReadSysctlHere("net/ipv4/ip_local_port_range"); normalizeSysctl(v) == "42000 42999" {
		t.Fatal("the write leaked into the process's namespace")
	}
}
