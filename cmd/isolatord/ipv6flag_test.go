package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"testing"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/dataplane"
	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator"
	"github.com/isolatord/isolatord/isolator/isolatortest"
)

func TestIPv6Flag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want dataplane.IPv6Mode
	}{
		{nil, dataplane.IPv6Auto},
		{[]string{"--ipv6"}, dataplane.IPv6On},
		{[]string{"--ipv6=true"}, dataplane.IPv6On},
		{[]string{"--ipv6=false"}, dataplane.IPv6Off},
		{[]string{"--ipv6=0"}, dataplane.IPv6Off},
		{[]string{"--ipv6=auto"}, dataplane.IPv6Auto},
	} {
		o, err := parseFlags(c.args, io.Discard)
		if err != nil {
			t.Errorf("parseFlags(%q): %v", c.args, err)
		} else if o.ipv6.mode != c.want {
			t.Errorf("parseFlags(%q): mode %v, want %v", c.args, o.ipv6.mode, c.want)
		}
	}
	if _, err := parseFlags([]string{"--ipv6=maybe"}, io.Discard); err == nil {
		t.Error("--ipv6=maybe accepted")
	}
	if _, err := parseFlags([]string{"--ipv6", "yes"}, io.Discard); err == nil {
		t.Error("a positional argument after --ipv6 accepted")
	}
}

// TestStatusHostIPv6: Status carries the host's IPv6 addresses containers
// share (none when they have no IPv6).
func TestStatusHostIPv6(t *testing.T) {
	for _, c := range []struct {
		v6   []net.IPNet
		want []string
	}{
		{nil, nil},
		{[]net.IPNet{{IP: net.ParseIP("2001:db8::1"), Mask: net.CIDRMask(64, 128)}, {IP: net.ParseIP("2001:db8:1::5"), Mask: net.CIDRMask(48, 128)}},
			[]string{"2001:db8::1/64", "2001:db8:1::5/48"}},
	} {
		dp := isolatortest.New()
		dp.Host.IPv6 = c.v6
		iso, err := isolator.New(isolator.Config{
			ManagedPorts:  ephemeral.MustParseSet("31000-31999"),
			EphemeralPool: ephemeral.MustParseSet("32768-33791"),
			BlockSize:     256,
			StateDir:      filepath.Join(t.TempDir(), "state"),
			Version:       "test",
			Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		}, dp)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := iso.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		st, err := (&server{iso: iso}).Status(context.Background(), &pb.StatusRequest{})
		iso.Close()
		if err != nil || !slices.Equal(st.GetHostIpv6(), c.want) {
			t.Errorf("status host_ipv6 = %q (%v), want %q", st.GetHostIpv6(), err, c.want)
		}
	}
}
