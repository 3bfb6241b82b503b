package main

import (
	"bytes"
	"net"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
)

// interfaceCases are containers' interfaces as the namespace shows them
// and as isolatord's Attach reports the same interface.
var interfaceCases = []struct {
	name string
	ns   nsIface
	eth0 *pb.AttachResponse_Interface
}{
	{
		name: "IPv4",
		ns: nsIface{MAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 1}, MTU: 1500,
			Addrs: []net.IPNet{{IP: net.IPv4(198, 18, 0, 1).To4(), Mask: net.CIDRMask(24, 32)}}, Gateway: net.IPv4(198, 18, 0, 2).To4()},
		eth0: &pb.AttachResponse_Interface{Mac: "02:00:00:00:00:01", Mtu: 1500, Ipv4Addresses: []string{"198.18.0.1/24"}, Ipv4Gateway: "198.18.0.2"},
	},
	{
		name: "no gateway",
		ns: nsIface{MAC: net.HardwareAddr{0x02, 0xab, 0, 0, 0, 9}, MTU: 9000,
			Addrs: []net.IPNet{{IP: net.IPv4(198, 19, 7, 1).To4(), Mask: net.CIDRMask(32, 32)}}},
		eth0: &pb.AttachResponse_Interface{Mac: "02:ab:00:00:00:09", Mtu: 9000, Ipv4Addresses: []string{"198.19.7.1/32"}},
	},
	{
		name: "IPv4 and two IPv6 addresses",
		ns: nsIface{MAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 1}, MTU: 1500,
			Addrs: []net.IPNet{{IP: net.IPv4(198, 18, 0, 1).To4(), Mask: net.CIDRMask(24, 32)}}, Gateway: net.IPv4(198, 18, 0, 2).To4(),
			Addrs6:   []net.IPNet{{IP: net.ParseIP("2001:db8:1::1"), Mask: net.CIDRMask(64, 128)}, {IP: net.ParseIP("2001:db8::1"), Mask: net.CIDRMask(48, 128)}},
			Gateway6: net.ParseIP("fe80::2")},
		eth0: &pb.AttachResponse_Interface{Mac: "02:00:00:00:00:01", Mtu: 1500, Ipv4Addresses: []string{"198.18.0.1/24"}, Ipv4Gateway: "198.18.0.2",
			Ipv6Addresses: []string{"2001:db8:1::1/64", "2001:db8::1/48"}, Ipv6Gateway: "fe80::2"},
	},
}

// TestAddResultSameFromAttach: the result an ADD prints from the interface
// isolatord's Attach reports is byte for byte the one it prints from
// reading the same interface in the namespace (a daemon without the
// field), in every result version; with the field, the namespace is not
// read at all.
func TestAddResultSameFromAttach(t *testing.T) {
	for _, tc := range interfaceCases {
		for _, version := range []string{"1.1.0", "1.0.0", "0.4.0"} {
			e := newEnv(t)
			e.plugin.ReadNS = func(string, string) (nsIface, error) { return tc.ns, nil }
			if err := e.plugin.Add(cmdArgs("c1", e.conf(version, twoMappings))); err != nil {
				t.Fatalf("%s %s, namespace read: %v", tc.name, version, err)
			}
			fromNS := bytes.Clone(e.out.Bytes())

			e = newEnv(t)
			e.daemon.eth0 = tc.eth0
			e.plugin.ReadNS = func(string, string) (nsIface, error) {
				t.Errorf("%s %s: the namespace was read although Attach reported eth0", tc.name, version)
				return tc.ns, nil
			}
			if err := e.plugin.Add(cmdArgs("c1", e.conf(version, twoMappings))); err != nil {
				t.Fatalf("%s %s, from Attach: %v", tc.name, version, err)
			}
			if got := e.out.Bytes(); !bytes.Equal(got, fromNS) {
				t.Errorf("%s %s: result from Attach\n%s\ndiffers from the namespace's\n%s", tc.name, version, got, fromNS)
			}
		}
	}
}

// TestAddRefusesBadInterface: an interface in Attach's reply that does not
// parse fails the ADD (code 999, naming the field) and the container the
// ADD created is cleaned up again.
func TestAddRefusesBadInterface(t *testing.T) {
	for field, eth0 := range map[string]*pb.AttachResponse_Interface{
		"eth0.mac":               {Mac: "not a mac", Ipv4Addresses: []string{"198.18.0.1/24"}},
		"eth0.ipv4_addresses[0]": {Ipv4Addresses: []string{"198.18.0.1"}},
		"eth0.ipv6_gateway":      {Ipv4Addresses: []string{"198.18.0.1/24"}, Ipv6Gateway: "fe80::zz"},
	} {
		e := newEnv(t)
		e.daemon.eth0 = eth0
		err := e.plugin.Add(cmdArgs("c1", e.conf("1.1.0", twoMappings)))
		ce, ok := err.(*types.Error)
		if !ok || ce.Code != types.ErrInternal || !strings.Contains(ce.Msg, field) {
			t.Errorf("%s: ADD error %v, want code %d naming %s", field, err, types.ErrInternal, field)
		}
		if e.daemon.has("c1") {
			t.Errorf("%s: the container stays after the failed ADD (calls: %s)", field, e.daemon.callLog())
		}
	}
}
