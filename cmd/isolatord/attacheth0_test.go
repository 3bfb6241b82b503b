package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator"
	"github.com/isolatord/isolatord/isolator/isolatortest"
	"github.com/isolatord/isolatord/isolator/plane"
)

// TestAttachEth0AfterHostChange: Attach reports the container's eth0 from
// the host's facts only for a container it isolated itself, configured
// from those facts. A retried Attach of a container isolated before (by
// an earlier run of the daemon, whose host had another address, MTU or
// IPv6) reports none, so that the plugin reads the namespace rather than
// describe an eth0 the container does not have.
func TestAttachEth0AfterHostChange(t *testing.T) {
	dir := t.TempDir()
	dp := isolatortest.New()
	dp.Host = plane.HostInfo{IP: net.IPNet{IP: net.IPv4(198, 18, 0, 1).To4(), Mask: net.CIDRMask(24, 32)}, MTU: 1500,
		MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, Gateway: net.IPv4(198, 18, 0, 254).To4()}
	start := func() *server {
		iso, err := isolator.New(isolator.Config{
			ManagedPorts:  ephemeral.MustParseSet("31000-31999"),
			EphemeralPool: ephemeral.MustParseSet("32768-33791"),
			BlockSize:     256,
			StateDir:      filepath.Join(dir, "state"),
			Version:       "test",
			Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		}, dp)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := iso.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { iso.Close() })
		return &server{iso: iso, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	}
	ctx := context.Background()
	s := start()
	req := attachReq("a1", nil, nil, pr(31001, 31001, false))
	first, err := s.Attach(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if first.GetWasIsolated() || len(first.GetEth0().GetIpv4Addresses()) != 1 || first.GetEth0().GetIpv4Addresses()[0] != "198.18.0.1/24" {
		t.Fatalf("first Attach: %v", first)
	}
	again, err := s.Attach(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if e := again.GetEth0(); !again.GetWasIsolated() || (e != nil && e.String() != first.GetEth0().String()) {
		t.Fatalf("retried Attach: eth0 %v, the container's %v", e, first.GetEth0())
	}
	s.iso.Close()

	// The host's address and MTU change while the daemon is down; the
	// container keeps the eth0 it was given.
	dp.Host.IP.IP, dp.Host.MTU = net.IPv4(198, 18, 1, 1).To4(), 9000
	s = start()
	r, err := s.Attach(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if e := r.GetEth0(); !r.GetWasIsolated() || (e != nil && e.String() != first.GetEth0().String()) {
		t.Fatalf("Attach after a restart on a changed host: eth0 %v, the container's %v", e, first.GetEth0())
	}
}
