package sysctl

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/nshandle/nstest"
)

// read reads one sysctl of ns.
func read(t *testing.T, ns *nshandle.NS, name string) string {
	t.Helper()
	var v string
	if err := In(ns, func(d *Dir) (err error) { v, err = d.Read(name); return err }); err != nil {
		t.Fatal(err)
	}
	return v
}

// readOwn reads one sysctl of the process's own namespace.
func readOwn(t *testing.T, name string) string {
	t.Helper()
	d := Open()
	defer d.Close()
	v, err := d.Read(name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestSetSaving(t *testing.T) {
	s := nstest.Scratch(t)
	var changed []Setting
	err := In(s, func(d *Dir) (err error) {
		if err := d.Write("net/ipv4/conf/lo/accept_local", "0"); err != nil {
			return err
		}
		changed, err = d.SetSaving(
			Setting{"net/ipv4/conf/lo/accept_local", "1"},
			Setting{"net/ipv4/conf/lo/rp_filter", "0"}, // already 0 in a fresh namespace
		)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(changed) != 1 || changed[0] != (Setting{"net/ipv4/conf/lo/accept_local", "0"}) {
		t.Fatalf("changed = %v", changed)
	}
	if v := read(t, s, "net/ipv4/conf/lo/accept_local"); v != "1" {
		t.Fatalf("accept_local = %q", v)
	}
}

func TestDir(t *testing.T) {
	s := nstest.Scratch(t)
	err := In(s, func(sd *Dir) error {
		if err := sd.Write("net/ipv4/ip_local_port_range", "41000 41999"); err != nil {
			return err
		}
		if v, err := sd.Read("net.ipv4.ip_local_port_range"); err != nil || normalize(v) != "41000 41999" {
			return fmt.Errorf("read back %q %v", v, err)
		}
		if _, err := sd.Read("kernel/ostype"); err != nil { // not under net/: full path
			return err
		}
		if _, err := sd.Read("net/ipv4/conf/nope0/forwarding"); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("missing sysctl: %v", err)
		}
		got, err := sd.ReadExisting("net/ipv4/no_such_sysctl", "net/core/somaxconn")
		if err != nil || len(got) != 1 || got[0].Name != "net/core/somaxconn" {
			return fmt.Errorf("ReadExisting = %v, %v", got, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The write happened in the scratch namespace only.
	if v := readOwn(t, "net/ipv4/ip_local_port_range"); normalize(v) == "41000 41999" {
		t.Fatal("the write leaked into the process's namespace")
	}
}

func TestSetIPv4Conf(t *testing.T) {
	s := nstest.Scratch(t)
	h := nstest.Netlink(t, s)
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	err = In(s, func(d *Dir) error {
		if err := d.Write("net/ipv4/conf/lo/rp_filter", "2"); err != nil {
			return err
		}
		return d.SetIPv4Conf(lo.Attrs().Index, map[int]uint32{
			DevconfRPFilter: 0, DevconfArpIgnore: 8, DevconfAcceptLocal: 1, DevconfRouteLocalnet: 1, DevconfForwarding: 1,
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"rp_filter": "0", "arp_ignore": "8", "accept_local": "1", "route_localnet": "1", "forwarding": "1"} {
		if v := read(t, s, "net/ipv4/conf/lo/"+k); v != want {
			t.Errorf("lo %s = %q, want %s", k, v, want)
		}
	}
	if err := In(s, func(d *Dir) error { return d.SetIPv4Conf(99999, map[int]uint32{DevconfForwarding: 0}) }); err == nil {
		t.Error("setting a missing link succeeded")
	}
}

// SetAllDisableIPv6 writes only when "all", "default" or a device holds
// another value, and then the write reaches every one of them.
func TestSetAllDisableIPv6(t *testing.T) {
	s := nstest.Scratch(t)
	var v6 bool
	if err := In(s, func(d *Dir) error { v6 = d.HasIPv6(); return nil }); err != nil || !v6 {
		t.Skipf("no IPv6 in this kernel (%v)", err)
	}
	err := In(s, func(d *Dir) error {
		const conf = "net/ipv6/conf"
		if same, err := d.allHold(conf, "disable_ipv6", "0"); err != nil || !same {
			return fmt.Errorf("a fresh namespace: all hold 0 = %v, %v", same, err)
		}
		if err := d.Write(conf+"/lo/disable_ipv6", "1"); err != nil {
			return err
		}
		if same, err := d.allHold(conf, "disable_ipv6", "0"); err != nil || same {
			return fmt.Errorf("lo 1: all hold 0 = %v, %v", same, err)
		}
		if err := d.SetAllDisableIPv6("0"); err != nil {
			return err
		}
		if v, err := d.Read(conf + "/lo/disable_ipv6"); err != nil || v != "0" {
			return fmt.Errorf("lo after all=0: %q %v", v, err)
		}
		if err := d.SetAllDisableIPv6("1"); err != nil {
			return err
		}
		for _, e := range []string{"all", "default", "lo"} {
			if v, err := d.Read(conf + "/" + e + "/disable_ipv6"); err != nil || v != "1" {
				return fmt.Errorf("%s after all=1: %q %v", e, v, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
