package main

import (
	"bytes"
	"math/rand"
	"net"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	types040 "github.com/containernetworking/cni/pkg/types/040"
	types100 "github.com/containernetworking/cni/pkg/types/100"

	lc "github.com/isolatord/isolatord/api/liteclient"
)

// lcContainer is an isolated container as Attach returns it.
var lcContainer = lc.Container{ContainerID: "c1", State: lc.StateIsolated, Veth: "iso0123456789ab"}

// TestPrintResultAsSDK: printResult writes byte for byte what the SDK's
// PrintTo writes, for random 1.x results (every field set or not, nil
// elements, strings JSON escapes, IPv4 and IPv6, empty and non-empty dns)
// and for the plugin's own results converted to every version it speaks.
func TestPrintResultAsSDK(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	strs := []string{"", "eth0", "iso0123456789ab", "/var/run/netns/cni-<&>", "ünïcode", "bad\xffutf8", "quote\"back\\slash\n", "\u2028"}
	str := func() string { return strs[rng.Intn(len(strs))] }
	ips := []net.IP{nil, net.IPv4(198, 18, 0, 1).To4(), net.IPv4(198, 18, 0, 2), net.ParseIP("2001:db8::1"), net.ParseIP("fe80::2")}
	ip := func() net.IP { return ips[rng.Intn(len(ips))] }
	ipnet := func() net.IPNet {
		a := ip()
		if a == nil {
			return net.IPNet{}
		}
		bits := 8 * len(a)
		if a.To4() != nil && rng.Intn(2) == 0 {
			a, bits = a.To4(), 32
		}
		return net.IPNet{IP: a, Mask: net.CIDRMask(rng.Intn(bits+1), bits)}
	}
	num := func() int { return []int{0, 1, 1500, 65535, -3, 1 << 40}[rng.Intn(6)] }
	ptr := func() *int {
		if rng.Intn(2) == 0 {
			return nil
		}
		n := num()
		return &n
	}
	strList := func() []string {
		var l []string
		for i := rng.Intn(3); i > 0; i-- {
			l = append(l, str())
		}
		return l
	}
	check := func(r types.Result, what string) {
		t.Helper()
		var want, got bytes.Buffer
		if err := r.PrintTo(&want); err != nil {
			t.Fatalf("%s: PrintTo: %v", what, err)
		}
		if err := printResult(&got, r); err != nil {
			t.Fatalf("%s: printResult: %v", what, err)
		}
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Fatalf("%s: printResult writes\n%s\nPrintTo\n%s", what, got.Bytes(), want.Bytes())
		}
	}
	for n := 0; n < 2000; n++ {
		r := &types100.Result{CNIVersion: []string{"", "1.0.0", "1.1.0"}[rng.Intn(3)]}
		for i := rng.Intn(4); i > 0; i-- {
			if rng.Intn(8) == 0 {
				r.Interfaces = append(r.Interfaces, nil)
				continue
			}
			r.Interfaces = append(r.Interfaces, &types100.Interface{Name: str(), Mac: str(), Mtu: num(), Sandbox: str(), SocketPath: str(), PciID: str()})
		}
		for i := rng.Intn(4); i > 0; i-- {
			if rng.Intn(8) == 0 {
				r.IPs = append(r.IPs, nil)
				continue
			}
			r.IPs = append(r.IPs, &types100.IPConfig{Interface: ptr(), Address: ipnet(), Gateway: ip()})
		}
		for i := rng.Intn(4); i > 0; i-- {
			if rng.Intn(8) == 0 {
				r.Routes = append(r.Routes, nil)
				continue
			}
			r.Routes = append(r.Routes, &types.Route{Dst: ipnet(), GW: ip(), MTU: num(), AdvMSS: num(), Priority: num(), Table: ptr(), Scope: ptr()})
		}
		if rng.Intn(2) == 0 {
			r.DNS = types.DNS{Nameservers: strList(), Domain: str(), Search: strList(), Options: strList()}
		}
		check(r, "random result")
	}
	for _, tc := range interfaceCases {
		res := buildResult(nil, &lcContainer, "eth0", "/run/netns/c1", tc.ns, tc.ns.Addrs[0])
		for _, v := range []string{"0.4.0", "1.0.0", "1.1.0"} {
			out, err := res.GetAsVersion(v)
			if err != nil {
				t.Fatal(err)
			}
			check(out, tc.name+" "+v)
		}
		prev, err := types040.NewResult([]byte(`{"cniVersion":"0.4.0","interfaces":[{"name":"lo"}],"dns":{"nameservers":["198.18.0.53"]}}`))
		if err != nil {
			t.Fatal(err)
		}
		p100, err := types100.NewResultFromResult(prev)
		if err != nil {
			t.Fatal(err)
		}
		check(buildResult(p100, &lcContainer, "eth0", "/run/netns/c1", tc.ns, tc.ns.Addrs[0]), tc.name+" chained")
	}
}
