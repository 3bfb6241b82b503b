package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
)

// TestAddRefusesInvalidUTF8: an ADD whose CNI_NETNS, or a CNI_ARGS value
// it keeps as a label, is not valid UTF-8 fails with code 4 naming the
// variable, before any call to isolatord; so does CHECK. Valid UTF-8
// beyond ASCII passes.
func TestAddRefusesInvalidUTF8(t *testing.T) {
	for _, tc := range []struct {
		name, netns, args, want string
	}{
		{"netns", "/run/netns/c\xff1", "", "CNI_NETNS"},
		{"label", "/run/netns/c1", "IgnoreUnknown=1;K8S_POD_NAME=web-\xc3\x28", "CNI_ARGS K8S_POD_NAME"},
		{"last label", "/run/netns/c1", "NOMAD_ALLOC_ID=\xed\xa0\x80", "CNI_ARGS NOMAD_ALLOC_ID"},
	} {
		for verb, run := range map[string]func(*Plugin, *skel.CmdArgs) error{"ADD": (*Plugin).Add, "CHECK": (*Plugin).Check} {
			e := newEnv(t)
			args := cmdArgs("c1", e.conf("1.1.0", twoMappings))
			if verb == "CHECK" {
				args.StdinData = e.conf("1.1.0", twoMappings+`,"prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/c1"}]}`)
			}
			args.Netns, args.Args = tc.netns, tc.args
			err := run(e.plugin, args)
			var ce *types.Error
			if !errors.As(err, &ce) || ce.Code != types.ErrInvalidEnvironmentVariables || !strings.Contains(ce.Msg, tc.want) || !strings.Contains(ce.Msg, "UTF-8") {
				t.Errorf("%s %s: error %v, want code %d naming %s", verb, tc.name, err, types.ErrInvalidEnvironmentVariables, tc.want)
			}
			if calls := e.daemon.callLog(); calls != "" {
				t.Errorf("%s %s: isolatord was called: %s", verb, tc.name, calls)
			}
		}
	}
	e := newEnv(t)
	args := cmdArgs("c1", e.conf("1.1.0", twoMappings))
	args.Args = "K8S_POD_NAME=web-ü"
	if err := e.plugin.Add(args); err != nil {
		t.Fatalf("ADD with a UTF-8 pod name: %v", err)
	}
	if l := e.daemon.ctrs["c1"].GetLabels()["cni.arg.K8S_POD_NAME"]; l != "web-ü" {
		t.Errorf("label %q, want web-ü", l)
	}
}
