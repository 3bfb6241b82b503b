package netns

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, veths and mounts")
	}
}

// scratch makes an anonymous network namespace (no process, no mount: it
// lives exactly as long as the returned NS is open) without moving the
// test's own threads.
func scratch(t *testing.T) *NS {
	t.Helper()
	needRoot(t)
	ns, err := New()
	if err != nil {
		t.Fatalf("scratch namespace: %v", err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

func nlh(t *testing.T, ns *NS) *netlink.Handle {
	t.Helper()
	h, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func TestOpenIdentity(t *testing.T) {
	needRoot(t)
	self, err := Current()
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	viaPid, err := OpenPid(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer viaPid.Close()
	if !self.SameAs(viaPid) {
		t.Fatalf("Current %v and OpenPid(self) %v differ", self, viaPid)
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	if self.Ino() != st.Ino {
		t.Fatalf("inode %d, stat says %d", self.Ino(), st.Ino)
	}
	s := scratch(t)
	if s.SameAs(self) {
		t.Fatal("scratch namespace equals our own")
	}
	if _, err := Open("/proc/self/ns/mnt"); err == nil || !strings.Contains(err.Error(), "not a network namespace") {
		t.Fatalf("opening a mount namespace: %v", err)
	}
	if _, err := Open("/etc/hostname"); err == nil {
		t.Fatal("opened a regular file as a namespace")
	}
	if _, err := OpenPid(0); err == nil {
		t.Fatal("OpenPid(0) succeeded")
	}
}

func TestDoSwitchesOnlyTheLockedThread(t *testing.T) {
	s := scratch(t)
	self, err := Current()
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	var inside uint64
	err = s.Do(func() error {
		var st unix.Stat_t
		if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
			return err
		}
		inside = st.Ino
		return WriteSysctlHere("net/ipv4/ip_local_port_range", "40000 40999")
	})
	if err != nil {
		t.Fatal(err)
	}
	if inside != s.Ino() {
		t.Fatalf("inside Do the thread was in net:[%d], want net:[%d]", inside, s.Ino())
	}
	got, err := s.ReadSysctl("net/ipv4/ip_local_port_range")
	if err != nil {
		t.Fatal(err)
	}
	if normalizeSysctl(got) != "40000 40999" {
		t.Fatalf("scratch ip_local_port_range = %q", got)
	}
	root, err := ReadSysctlHere("net/ipv4/ip_local_port_range")
	if err != nil {
		t.Fatal(err)
	}
	if normalizeSysctl(root) == "40000 40999" {
		t.Fatal("the write leaked into the process's namespace")
	}
	// Many goroutines after Do: none of them may find itself elsewhere.
	for i := 0; i < 50; i++ {
		if err := s.Do(func() error { return nil }); err != nil {
			t.Fatal(err)
		}
		now, err := Current()
		if err != nil {
			t.Fatal(err)
		}
		same := now.SameAs(self)
		now.Close()
		if !same {
			t.Fatal("a goroutine ended up outside the process namespace after Do")
		}
	}
	if err := s.Do(func() error { panic("boom") }); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("panic inside Do: %v", err)
	}
	if _, err := s.ReadSysctl("net/ipv4/no_such_sysctl"); err == nil {
		t.Fatal("reading a missing sysctl succeeded")
	}
	got2, err := s.ReadSysctls("net/ipv4/no_such_sysctl", "net/core/somaxconn")
	if err != nil || len(got2) != 1 || got2[0].Name != "net/core/somaxconn" {
		t.Fatalf("ReadSysctls = %v, %v", got2, err)
	}
}

func TestSetSysctlsSaving(t *testing.T) {
	s := scratch(t)
	if err := s.WriteSysctls(Sysctl{"net/ipv4/conf/lo/accept_local", "0"}); err != nil {
		t.Fatal(err)
	}
	changed, err := s.SetSysctlsSaving(
		Sysctl{"net/ipv4/conf/lo/accept_local", "1"},
		Sysctl{"net/ipv4/conf/lo/rp_filter", "0"}, // already 0 in a fresh namespace
	)
	if err != nil {
		t.Fatal(err)
	}
	if len(changed) != 1 || changed[0] != (Sysctl{"net/ipv4/conf/lo/accept_local", "0"}) {
		t.Fatalf("changed = %v", changed)
	}
	if v, _ := s.ReadSysctl("net/ipv4/conf/lo/accept_local"); v != "1" {
		t.Fatalf("accept_local = %q", v)
	}
}

var testMAC = net.HardwareAddr{0x02, 0x18, 0x00, 0x00, 0x00, 0x01}

// hostWithEth0 builds a scratch "host" whose eth0 (198.18.0.1/24, default
// route via 198.18.0.2) is a veth to a scratch "client".
func hostWithEth0(t *testing.T) (host, client *NS, hh *netlink.Handle) {
	host, client = scratch(t), scratch(t)
	hh = nlh(t, host)
	idx, err := CreateVeth(hh, client, VethSpec{Name: "eth0", PeerName: "eth0", MAC: testMAC, MTU: 1400})
	if err != nil {
		t.Fatal(err)
	}
	eth := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: idx}}
	a, _ := netlink.ParseAddr("198.18.0.1/24")
	if err := hh.AddrAdd(eth, a); err != nil {
		t.Fatal(err)
	}
	if err := LinkUp(hh, idx); err != nil {
		t.Fatal(err)
	}
	ch := nlh(t, client)
	ceth, err := ch.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := netlink.ParseAddr("198.18.0.2/24")
	if err := ch.AddrAdd(ceth, ca); err != nil {
		t.Fatal(err)
	}
	if err := ch.LinkSetUp(ceth); err != nil {
		t.Fatal(err)
	}
	if err := hh.RouteAdd(&netlink.Route{LinkIndex: idx, Gw: net.ParseIP("198.18.0.2")}); err != nil {
		t.Fatal(err)
	}
	return host, client, hh
}

func TestReadHostLinks(t *testing.T) {
	_, _, hh := hostWithEth0(t)
	lo, _ := hh.LinkByName("lo")
	hh.LinkSetUp(lo)
	hl, err := ReadHostLinks(hh, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if hl.Eth0 != "eth0" || hl.Lo != "lo" || hl.Addr.String() != "198.18.0.1/24" ||
		!bytes.Equal(hl.MAC, testMAC) || hl.MTU != 1400 || !hl.Gateway.Equal(net.ParseIP("198.18.0.2")) ||
		hl.LoIndex != lo.Attrs().Index || hl.Eth0Index == 0 {
		t.Fatalf("host links = %+v", hl)
	}
	if _, err := ReadHostLinks(hh, "nope0", ""); err == nil {
		t.Fatal("missing eth0 accepted")
	}
	if _, err := ReadHostLinks(hh, "lo", ""); err == nil || !strings.Contains(err.Error(), "no Ethernet MAC") {
		t.Fatalf("lo as eth0: %v", err)
	}
	// No default route: the public interface must be named, and then the
	// gateway is nil.
	if err := hh.RouteDel(&netlink.Route{LinkIndex: hl.Eth0Index, Gw: net.ParseIP("198.18.0.2")}); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadHostLinks(hh, "", ""); err == nil {
		t.Fatal("picked a public interface without a default route")
	}
	hl, err = ReadHostLinks(hh, "eth0", "lo")
	if err != nil || hl.Gateway != nil {
		t.Fatalf("named eth0 without default route: %+v %v", hl, err)
	}
}

func TestVethAndContainerConfig(t *testing.T) {
	host, _, hh := hostWithEth0(t)
	ctr := scratch(t)
	ch := nlh(t, ctr)

	idx, err := CreateVeth(hh, ctr, VethSpec{Name: "isotest0", PeerName: "eth0", MAC: testMAC, MTU: 1400})
	if err != nil {
		t.Fatal(err)
	}
	hv, err := hh.LinkByIndex(idx)
	if err != nil {
		t.Fatal(err)
	}
	if hv.Attrs().Name != "isotest0" || !bytes.Equal(hv.Attrs().HardwareAddr, testMAC) || hv.Attrs().MTU != 1400 {
		t.Fatalf("host end: %+v", hv.Attrs())
	}
	pe, err := ch.LinkByName("eth0")
	if err != nil {
		t.Fatalf("peer not created inside the container: %v", err)
	}
	if !bytes.Equal(pe.Attrs().HardwareAddr, testMAC) || pe.Attrs().MTU != 1400 {
		t.Fatalf("peer: %+v", pe.Attrs())
	}
	if _, err := CreateVeth(hh, ctr, VethSpec{Name: "isotest0", PeerName: "eth1", MAC: testMAC}); err == nil {
		t.Fatal("second veth with the same name accepted")
	}
	if _, err := CreateVeth(hh, ctr, VethSpec{Name: "waytoolongname16", PeerName: "eth1", MAC: testMAC}); err == nil {
		t.Fatal("16-byte name accepted")
	}

	if err := host.Do(func() error { return DisableIPv6Here("isotest0") }); err != nil {
		t.Fatal(err)
	}
	if v, _ := host.ReadSysctl("net/ipv6/conf/isotest0/disable_ipv6"); v != "1" {
		t.Fatalf("host veth disable_ipv6 = %q", v)
	}

	cfg := ContainerConfig{
		Eth0: "eth0", Addr: net.IPNet{IP: net.IPv4(198, 18, 0, 1), Mask: net.CIDRMask(24, 32)},
		MAC: testMAC, MTU: 1400, Gateway: net.ParseIP("198.18.0.2"),
		Ports: ephemeral.Range{Begin: 32768, End: 33791},
		Copy:  []Sysctl{{"net/core/somaxconn", "777"}, {"net/ipv4/not_here", "1"}},
	}
	cl, err := ConfigureContainer(ctr, ch, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if cl.Eth0 != pe.Attrs().Index || cl.Lo == 0 {
		t.Fatalf("links %+v", cl)
	}
	want := map[string]string{
		"net/ipv4/ip_local_port_range":       "32768 33791",
		"net/ipv4/conf/eth0/accept_local":    "1",
		"net/ipv4/conf/lo/accept_local":      "1",
		"net/ipv4/conf/lo/route_localnet":    "1",
		"net/ipv4/conf/eth0/arp_ignore":      "8",
		"net/ipv4/conf/all/rp_filter":        "0",
		"net/ipv6/conf/all/disable_ipv6":     "1",
		"net/ipv6/conf/eth0/disable_ipv6":    "1",
		"net/ipv6/conf/lo/disable_ipv6":      "1",
		"net/ipv6/conf/default/disable_ipv6": "1",
		"net/core/somaxconn":                 "777",
	}
	for k, v := range want {
		got, err := ctr.ReadSysctl(k)
		if err != nil || normalizeSysctl(got) != v {
			t.Errorf("container %s = %q (%v), want %q", k, got, err, v)
		}
	}
	lo, _ := ch.LinkByName("lo")
	eth, _ := ch.LinkByName("eth0")
	if !bytes.Equal(lo.Attrs().HardwareAddr, testMAC) || lo.Attrs().MTU != 1400 || lo.Attrs().Flags&net.FlagUp == 0 {
		t.Fatalf("container lo: %+v", lo.Attrs())
	}
	if eth.Attrs().Flags&net.FlagUp == 0 {
		t.Fatal("container eth0 down")
	}
	addrs, _ := ch.AddrList(eth, netlink.FAMILY_ALL)
	if len(addrs) != 1 || addrs[0].IPNet.String() != "198.18.0.1/24" {
		t.Fatalf("container eth0 addresses %v (IPv6 must be off)", addrs)
	}
	routes, _ := ch.RouteList(eth, netlink.FAMILY_V4)
	var gw bool
	for _, r := range routes {
		if (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw.Equal(net.ParseIP("198.18.0.2")) {
			gw = true
		}
	}
	if !gw {
		t.Fatalf("no default route via the gateway: %v", routes)
	}

	// Deleting the host end takes the peer with it.
	existed, err := DeleteLink(hh, idx)
	if err != nil || !existed {
		t.Fatalf("DeleteLink = %v %v", existed, err)
	}
	if _, err := ch.LinkByName("eth0"); err == nil {
		t.Fatal("peer survived the host end")
	}
	existed, err = DeleteLink(hh, idx)
	if err != nil || existed {
		t.Fatalf("second DeleteLink = %v %v", existed, err)
	}
	existed, err = DeleteLinkByName(hh, "isotest0")
	if err != nil || existed {
		t.Fatalf("DeleteLinkByName of a gone link = %v %v", existed, err)
	}
}

func TestPeerCounters(t *testing.T) {
	host, ctr := scratch(t), scratch(t)
	hh, ch := nlh(t, host), nlh(t, ctr)
	idx, err := CreateVeth(hh, ctr, VethSpec{Name: "isocnt0", PeerName: "eth0", MAC: testMAC, MTU: 1500})
	if err != nil {
		t.Fatal(err)
	}
	LinkUp(hh, idx)
	eth, _ := ch.LinkByName("eth0")
	a, _ := netlink.ParseAddr("198.18.5.2/24")
	ch.AddrAdd(eth, a)
	ch.LinkSetUp(eth)
	// Peer address for the neighbour: a static entry so no ARP is needed.
	ch.NeighAdd(&netlink.Neigh{LinkIndex: eth.Attrs().Index, State: netlink.NUD_PERMANENT,
		IP: net.ParseIP("198.18.5.1"), HardwareAddr: testMAC})
	before, err := PeerCounters(hh, idx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 10
	err = ctr.Do(func() error {
		c, err := net.Dial("udp4", "198.18.5.1:9")
		if err != nil {
			return err
		}
		defer c.Close()
		for i := 0; i < n; i++ {
			if _, err := c.Write(make([]byte, 100)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var after LinkCounters
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		after, err = PeerCounters(hh, idx)
		if err != nil {
			t.Fatal(err)
		}
		if after.TxPackets-before.TxPackets >= n {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if d := after.TxPackets - before.TxPackets; d < n {
		t.Fatalf("container tx packets grew by %d, want >= %d (rx/tx not swapped?)", d, n)
	}
	if after.TxBytes-before.TxBytes < n*100 {
		t.Fatalf("container tx bytes grew by %d", after.TxBytes-before.TxBytes)
	}
	if _, err := PeerCounters(hh, 999999); err == nil {
		t.Fatal("counters of a missing link")
	}
}

func TestBindMounts(t *testing.T) {
	needRoot(t)
	dir := filepath.Join(t.TempDir(), "netns")
	t.Cleanup(func() {
		// Undo EnsureSharedDir's self-bind (and anything stacked) before
		// TempDir's cleanup removes the directory.
		for i := 0; i < 5; i++ {
			if unix.Unmount(dir, unix.MNT_DETACH) != nil {
				break
			}
		}
	})
	if err := EnsureSharedDir(dir); err != nil {
		t.Fatal(err)
	}
	topShared := func() (int, bool) {
		ms, err := ReadMountInfo()
		if err != nil {
			t.Fatal(err)
		}
		n, shared := 0, false
		for _, m := range ms {
			if m.MountPoint == dir {
				n++
				shared = m.Shared()
			}
		}
		return n, shared
	}
	if n, shared := topShared(); n != 1 || !shared {
		t.Fatalf("after EnsureSharedDir: %d mounts on %s, shared=%v", n, dir, shared)
	}
	if err := EnsureSharedDir(dir); err != nil {
		t.Fatal(err)
	}
	if n, _ := topShared(); n != 1 {
		t.Fatalf("EnsureSharedDir is not idempotent: %d mounts", n)
	}

	a, b := scratch(t), scratch(t)
	p, err := BindMount(a, dir, "ctr-a")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Unmount(dir, "ctr-a") })
	if p2, err := BindMount(a, dir, "ctr-a"); err != nil || p2 != p {
		t.Fatalf("re-mount of the same namespace: %v %v", p2, err)
	}
	if _, err := BindMount(b, dir, "ctr-a"); err == nil {
		t.Fatal("mounted another namespace over an existing pin")
	}
	for _, bad := range []string{"", ".", "..", "a/b"} {
		if _, err := BindMount(a, dir, bad); err == nil {
			t.Fatalf("name %q accepted", bad)
		}
	}
	pinned, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	same := pinned.SameAs(a)
	pinned.Close()
	if !same {
		t.Fatal("the pin is another namespace")
	}
	// A plain file in the dir is not listed.
	os.WriteFile(filepath.Join(dir, "junk"), nil, 0o644)
	ms, err := NsMounts(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms["ctr-a"] != a.Ino() {
		t.Fatalf("NsMounts = %v, want ctr-a -> %d", ms, a.Ino())
	}
	// An empty stale file is reused.
	if _, err := BindMount(b, dir, "junk"); err != nil {
		t.Fatalf("reusing an empty file: %v", err)
	}
	t.Cleanup(func() { Unmount(dir, "junk") })

	mounted, existed, err := Unmount(dir, "ctr-a")
	if err != nil || !mounted || !existed {
		t.Fatalf("Unmount = %v %v %v", mounted, existed, err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("mount point still there: %v", err)
	}
	mounted, existed, err = Unmount(dir, "ctr-a")
	if err != nil || mounted || existed {
		t.Fatalf("second Unmount = %v %v %v", mounted, existed, err)
	}
	ms, _ = NsMounts(dir)
	if _, ok := ms["ctr-a"]; ok || len(ms) != 1 {
		t.Fatalf("NsMounts after unmount = %v", ms)
	}
	if ms, err := NsMounts(filepath.Join(dir, "nope")); err != nil || len(ms) != 0 {
		t.Fatalf("NsMounts of a missing dir = %v %v", ms, err)
	}
}

func TestParseMountInfo(t *testing.T) {
	m, ok := parseMountInfoLine(`36 35 98:0 net:[4026532] /run/netns/a\040b rw shared:5 master:1 - nsfs nsfs rw`)
	if !ok || m.ID != 36 || m.Parent != 35 || m.Root != "net:[4026532]" || m.MountPoint != "/run/netns/a b" ||
		!m.Shared() || m.FSType != "nsfs" || len(m.Optional) != 2 {
		t.Fatalf("%+v %v", m, ok)
	}
	m, ok = parseMountInfoLine(`1 0 8:1 / / rw - ext4 /dev/sda1 rw`)
	if !ok || m.Shared() || len(m.Optional) != 0 || m.MountPoint != "/" {
		t.Fatalf("%+v %v", m, ok)
	}
	if _, ok := parseMountInfoLine("garbage"); ok {
		t.Fatal("garbage parsed")
	}
}

func TestEnsureSysctl(t *testing.T) {
	s := scratch(t)
	var wrote1, wrote2 bool
	err := s.Do(func() (err error) {
		if wrote1, err = EnsureSysctlHere("net/ipv4/ip_local_port_range", "40000\t40999"); err != nil {
			return err
		}
		wrote2, err = EnsureSysctlHere("net/ipv4/ip_local_port_range", "40000 40999")
		return err
	})
	if err != nil || !wrote1 || wrote2 {
		t.Fatalf("EnsureSysctlHere: first wrote %v, second wrote %v, %v", wrote1, wrote2, err)
	}
	if v, _ := s.ReadSysctl("net/ipv4/ip_local_port_range"); normalizeSysctl(v) != "40000 40999" {
		t.Fatalf("value %q", v)
	}
}

func TestSysctlDir(t *testing.T) {
	s := scratch(t)
	err := s.Do(func() error {
		sd, err := OpenSysctlDir()
		if err != nil {
			return err
		}
		defer sd.Close()
		if err := sd.Write("net/ipv4/ip_local_port_range", "41000 41999"); err != nil {
			return err
		}
		if v, err := sd.Read("net.ipv4.ip_local_port_range"); err != nil || normalizeSysctl(v) != "41000 41999" {
			return fmt.Errorf("read back %q %v", v, err)
		}
		if _, err := sd.Read("kernel/ostype"); err != nil { // not under net/: full path
			return err
		}
		if _, err := sd.Read("net/ipv4/conf/nope0/forwarding"); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("missing sysctl: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The write happened in the scratch namespace only.
	if v, _ := ReadSysctlHere("net/ipv4/ip_local_port_range"); normalizeSysctl(v) == "41000 41999" {
		t.Fatal("the write leaked into the process's namespace")
	}
}

func TestSetIPv4ConfHere(t *testing.T) {
	s := scratch(t)
	h := nlh(t, s)
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WriteSysctls(Sysctl{"net/ipv4/conf/lo/rp_filter", "2"}); err != nil {
		t.Fatal(err)
	}
	err = s.Do(func() error {
		return SetIPv4ConfHere(lo.Attrs().Index, map[int]uint32{
			DevconfRPFilter: 0, DevconfArpIgnore: 8, DevconfAcceptLocal: 1, DevconfRouteLocalnet: 1, DevconfForwarding: 1,
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"rp_filter": "0", "arp_ignore": "8", "accept_local": "1", "route_localnet": "1", "forwarding": "1"} {
		if v, err := s.ReadSysctl("net/ipv4/conf/lo/" + k); err != nil || v != want {
			t.Errorf("lo %s = %q (%v), want %s", k, v, err, want)
		}
	}
	if err := s.Do(func() error { return SetIPv4ConfHere(99999, map[int]uint32{DevconfForwarding: 0}) }); err == nil {
		t.Error("setting a missing link succeeded")
	}
}
