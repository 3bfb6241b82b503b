package main

import (
	"errors"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
)

// TestAddRollbackKeepsReplacement: ADD's rollback (a step after Attach
// failed) removes the container only if it is still this network's: one
// replaced meanwhile (another caller's DEL, then an ADD of the same id for
// another network) is left to its owner, as isolatord's own rollback of a
// failed Attach leaves it.
func TestAddRollbackKeepsReplacement(t *testing.T) {
	e := newEnv(t)
	e.plugin.ReadNS = func(string, string) (nsIface, error) {
		e.daemon.put(&pb.Container{ContainerId: "c1", State: pb.ContainerState_CONTAINER_STATE_ISOLATED,
			Labels: map[string]string{LabelNetwork: "other", LabelIfName: "eth0"}})
		return nsIface{}, errors.New("no eth0")
	}
	cniErr(t, e.plugin.Add(cmdArgs("c1", e.conf("1.0.0", twoMappings))), types.ErrInternal)
	if !e.daemon.has("c1") {
		t.Errorf("ADD's rollback removed the container another network holds now; calls: %s", e.daemon.callLog())
	}
}
