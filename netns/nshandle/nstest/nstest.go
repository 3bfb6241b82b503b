// Package nstest gives tests scratch network namespaces: anonymous ones (no
// process, no mount) that live exactly as long as the test, made without
// moving the test's own threads. It is test support, imported only by
// _test.go files.
package nstest

import (
	"os"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/isolatord/isolatord/netns/nshandle"
)

// NeedRoot skips the test unless it runs as root.
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, veths and mounts")
	}
}

// Scratch makes an anonymous network namespace, closed when the test ends
// (and with that gone, unless something else holds it). It skips the test
// when not root.
func Scratch(t testing.TB) *nshandle.NS {
	t.Helper()
	NeedRoot(t)
	ns, err := nshandle.New()
	if err != nil {
		t.Fatalf("scratch namespace: %v", err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

// Netlink opens a netlink handle in ns, closed when the test ends.
func Netlink(t testing.TB, ns *nshandle.NS) *netlink.Handle {
	t.Helper()
	h, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}
