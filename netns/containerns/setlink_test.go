package containerns

import (
	"bytes"
	"net"
	"strings"
	"testing"

	"github.com/isolatord/isolatord/netns/nshandle/nstest"
	"github.com/isolatord/isolatord/netns/sysctl"
)

// A linkChange sets everything it carries in one request, and a request
// the kernel refuses (an IPv4 setting id it does not know) changes
// nothing: the MAC and MTU it also carried are not set.
func TestLinkChange(t *testing.T) {
	ns := nstest.Scratch(t)
	h := nstest.Netlink(t, ns)
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	mac0, mtu0 := lo.Attrs().HardwareAddr, lo.Attrs().MTU
	bad := linkChange{index: lo.Attrs().Index, mac: testMAC, mtu: 1300, up: true, ipv4: map[int]uint32{sysctl.DevconfAcceptLocal: 1, 999: 1}}
	err = ns.Do(bad.apply)
	if err == nil || !strings.Contains(err.Error(), "MAC "+testMAC.String()) {
		t.Fatalf("refused change: %v, want an error naming what it sets", err)
	}
	if lo, err = h.LinkByName("lo"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(lo.Attrs().HardwareAddr, mac0) || lo.Attrs().MTU != mtu0 || lo.Attrs().Flags&net.FlagUp != 0 {
		t.Fatalf("a refused change changed lo: %+v", lo.Attrs())
	}

	good := bad
	good.ipv4 = map[int]uint32{sysctl.DevconfAcceptLocal: 1, sysctl.DevconfRouteLocalnet: 1, sysctl.DevconfRPFilter: 0}
	good.noAddrGen = true
	if err := ns.Do(good.apply); err != nil {
		t.Fatal(err)
	}
	if lo, err = h.LinkByName("lo"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(lo.Attrs().HardwareAddr, testMAC) || lo.Attrs().MTU != 1300 || lo.Attrs().Flags&net.FlagUp == 0 {
		t.Fatalf("lo after the change: %+v", lo.Attrs())
	}
	for k, want := range map[string]string{
		"net/ipv4/conf/lo/accept_local": "1", "net/ipv4/conf/lo/route_localnet": "1", "net/ipv4/conf/lo/rp_filter": "0",
		"net/ipv6/conf/lo/addr_gen_mode": "1",
	} {
		if v, err := readSysctl(ns, k); err != nil || v != want {
			t.Errorf("%s = %q (%v), want %s", k, v, err, want)
		}
	}
	if err := ns.Do(linkChange{index: 9999, up: true}.apply); err == nil {
		t.Error("a change of a missing link succeeded")
	}
}
