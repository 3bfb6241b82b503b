package main

import (
	"errors"
	"os"
	"testing"

	"github.com/containernetworking/cni/pkg/ns"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/isolatord/isolatord/netns/nshandle/nstest"
)

// TestNetNSCheckAgreesWithSkel: the plugin's check refuses exactly the
// paths the SDK's (what skel runs) finds to be the plugin's namespace:
// its own by any name, not a scratch namespace, not a missing path or
// none.
func TestNetNSCheckAgreesWithSkel(t *testing.T) {
	paths := []string{"/proc/self/ns/net", "/proc/thread-self/ns/net", "", "/nonexistent/ns/net", "/proc/1/ns/net"}
	if os.Geteuid() == 0 {
		paths = append(paths, nstest.Scratch(t).Path())
	}
	own := 0
	for _, p := range paths {
		same, serr := ns.CheckNetNS(p)
		if serr != nil {
			t.Fatalf("%q: the SDK's check fails: %v", p, serr)
		}
		err := checkNotOwnNetNS(p)
		var ce *types.Error
		switch {
		case same && (!errors.As(err, &ce) || ce.Code != types.ErrInvalidNetNS || ce.Msg != "plugin's netns and netns from CNI_NETNS should not be the same"):
			t.Errorf("%q is the plugin's namespace: error %v, want skel's (code %d)", p, err, types.ErrInvalidNetNS)
		case !same && err != nil:
			t.Errorf("%q is not the plugin's namespace: %v", p, err)
		}
		if same {
			own++
		}
	}
	if own < 2 {
		t.Fatalf("only %d of %q are the plugin's namespace: the test compares nothing", own, paths)
	}
}

// TestNetNSChecked: the check runs after a verb that succeeds (as skel
// runs it), not after one that fails, and not when the runtime set
// CNI_NETNS_OVERRIDE; an ADD in the plugin's own namespace fails with
// skel's error.
func TestNetNSChecked(t *testing.T) {
	ok := func(*skel.CmdArgs) error { return nil }
	failed := types.NewError(types.ErrInternal, "the verb failed", "")
	fail := func(*skel.CmdArgs) error { return failed }
	own := &skel.CmdArgs{Netns: "/proc/self/ns/net"}
	if err := netnsChecked(fail, false)(own); err != failed {
		t.Errorf("failed verb: %v, want its own error", err)
	}
	if err := netnsChecked(ok, true)(own); err != nil {
		t.Errorf("with CNI_NETNS_OVERRIDE: %v", err)
	}
	if err := netnsChecked(ok, false)(&skel.CmdArgs{Netns: "/nonexistent"}); err != nil {
		t.Errorf("a namespace that is gone: %v", err)
	}
	e := newEnv(t)
	args := cmdArgs("c1", e.conf("1.1.0", twoMappings))
	args.Netns = "/proc/self/ns/net"
	cniErr(t, netnsChecked(e.plugin.Add, false)(args), types.ErrInvalidNetNS)
	for v, want := range map[string]bool{"": false, "0": false, "1": true, "true": true, "TRUE": true, "yes": false} {
		if netnsOverride(v) != want {
			t.Errorf("CNI_NETNS_OVERRIDE=%q turns the check off: %v, want %v", v, !want, want)
		}
	}
}
