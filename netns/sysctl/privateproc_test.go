package sysctl

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/nshandle/nstest"
	"github.com/isolatord/isolatord/test/wait"
)

func TestDisableIPv6(t *testing.T) {
	s := nstest.Scratch(t)
	before := readOwn(t, "net/ipv6/conf/lo/disable_ipv6")
	err := In(s, func(d *Dir) error {
		if !d.HasIPv6() {
			return nil
		}
		if err := d.DisableIPv6("lo"); err != nil {
			return err
		}
		if v, err := d.Read("net/ipv6/conf/lo/disable_ipv6"); err != nil || v != "1" {
			return fmt.Errorf("lo disable_ipv6 read back %q %v", v, err)
		}
		if err := d.DisableIPv6("nope0"); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("missing device: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The write happened in the scratch namespace only.
	if v := readOwn(t, "net/ipv6/conf/lo/disable_ipv6"); v != before {
		t.Fatalf("the write leaked into the process's namespace: lo disable_ipv6 %q, was %q", v, before)
	}
}

// The private procfs instance shows the calling thread's namespace, like
// /proc/sys does: a write through it is read back by the full path there.
func TestPrivateSysNet(t *testing.T) {
	s := nstest.Scratch(t)
	const portRange = "/proc/sys/net/ipv4/ip_local_port_range"
	err := s.Do(func() error {
		f, err := openPrivateSysNet()
		if err != nil {
			return err
		}
		sd := &Dir{net: &sysNet{dir: f, refs: 1}, sub: map[string]*os.File{}}
		defer sd.Close()
		if err := sd.Write("net/ipv4/ip_local_port_range", "42000 42999"); err != nil {
			return err
		}
		if v, err := os.ReadFile(portRange); err != nil || normalize(string(v)) != "42000 42999" {
			return fmt.Errorf("read back by the full path: %q %v", v, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := os.ReadFile(portRange); normalize(string(v)) == "42000 42999" {
		t.Fatal("the write leaked into the process's namespace")
	}
}

// A Dir takes a private instance at its first key below net/ (never
// walking /proc/sys/net), none for keys elsewhere; an instance serves at
// most instanceUses Dirs, and the instances are released after the Dirs
// close (their descriptors closed in the background): the process's
// descriptors come back to where they were, but for the current instance.
func TestInstancesMadeAndReleased(t *testing.T) {
	s := nstest.Scratch(t)
	fds := func() int {
		es, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(es)
	}
	var shared unix.Stat_t
	if err := unix.Stat("/proc/sys/net", &shared); err != nil {
		t.Fatal(err)
	}
	// heldDev is the device of d's net directory, after a key below net/.
	heldDev := func(d *Dir) (uint64, error) {
		if _, err := d.Read("net/ipv4/ip_local_port_range"); err != nil {
			return 0, err
		}
		if d.net == nil {
			return 0, errors.New("no directory held from the first key on")
		}
		var held unix.Stat_t
		if err := unix.Fstat(int(d.net.dir.Fd()), &held); err != nil {
			return 0, err
		}
		if held.Dev == shared.Dev {
			return 0, errors.New("the held net directory is the shared /proc's, not a private instance's")
		}
		return held.Dev, nil
	}
	err := In(s, func(d *Dir) error {
		if _, err := d.Read("kernel/ostype"); err != nil {
			return err
		}
		if d.net != nil {
			return errors.New("an instance was taken for a key outside net/")
		}
		_, err := heldDev(d)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	before := fds()
	uses := map[*sysNet]int{}
	for range 3 * instanceUses {
		err := In(s, func(d *Dir) error {
			if _, err := heldDev(d); err != nil {
				return err
			}
			uses[d.net]++
			for _, k := range []string{"net/core/somaxconn", "kernel/ostype"} {
				if _, err := d.Read(k); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(uses) < 3 {
		t.Errorf("%d Dirs used %d instances, want a new one each %d: %v", 3*instanceUses, len(uses), instanceUses, uses)
	}
	for in, n := range uses {
		if n > instanceUses {
			t.Errorf("instance %p served %d Dirs, more than %d", in, n, instanceUses)
		}
	}
	if !wait.Until(10*time.Second, func() bool { return fds() <= before }) {
		t.Fatalf("%d descriptors open 10 s after the Dirs closed, %d before", fds(), before)
	}
}
