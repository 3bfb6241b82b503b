package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"
	"github.com/isolatord/isolatord/ephemeral"
)

// Handoff through CNI_ARGS (docs/handoff.md): a new container takes ports
// over from a predecessor that drains, without a moment where the port is
// free or refuses connections.
//
//	ISOLATOR_HANDOFF_PORTS=8080,8443   the ports handed over (among the
//	                                   container's own)
//	ISOLATOR_HANDOFF_FROM=<id>         the predecessor's container id (of
//	                                   this network, and of this Nomad
//	                                   namespace when the call names one), or
//	                                   "auto": the one container of this
//	                                   network holding those ports whose
//	                                   Nomad namespace, job and group labels
//	                                   are this call's (a rolling update of
//	                                   one task group on one host)
const (
	ArgHandoffFrom  = "ISOLATOR_HANDOFF_FROM"
	ArgHandoffPorts = "ISOLATOR_HANDOFF_PORTS"
	handoffAuto     = "auto"
)

// sameGroup are the labels a predecessor found with "auto" must share with
// the successor.
var sameGroup = []string{"NOMAD_NAMESPACE", "NOMAD_JOB_ID", "NOMAD_GROUP_NAME"}

// handoff reads the handoff arguments; from is "" when there are none.
// "auto" is resolved by asking isolatord for its containers.
func handoff(ctx context.Context, c isolatordv1grpc.IsolatorClient, args cniArgs, network, id string) (from string, ports []uint32, err error) {
	from, hasFrom := args[ArgHandoffFrom]
	pv, hasPorts := args[ArgHandoffPorts]
	if !hasFrom && !hasPorts {
		return "", nil, nil
	}
	if from == "" || pv == "" {
		return "", nil, types.NewError(types.ErrInvalidEnvironmentVariables,
			fmt.Sprintf("isolator-cni: CNI_ARGS %s and %s go together", ArgHandoffFrom, ArgHandoffPorts), "")
	}
	set, err := ephemeral.ParseSet(strings.ReplaceAll(pv, " ", ""))
	if err != nil || set.Empty() {
		return "", nil, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("isolator-cni: CNI_ARGS %s=%s: not a port list", ArgHandoffPorts, pv), "")
	}
	for _, p := range set.Ports() {
		ports = append(ports, uint32(p))
	}
	if from != handoffAuto {
		if err := checkPredecessor(ctx, c, args, network, from); err != nil {
			return "", nil, err
		}
		return from, ports, nil
	}
	for _, k := range sameGroup {
		if args[k] == "" {
			return "", nil, types.NewError(types.ErrInvalidEnvironmentVariables,
				fmt.Sprintf("isolator-cni: CNI_ARGS %s=auto needs %s to find the predecessor", ArgHandoffFrom, strings.Join(sameGroup, ", ")), "")
		}
	}
	list, err := c.List(ctx, &pb.ListRequest{})
	if err != nil {
		return "", nil, err
	}
	var found []string
	for _, ctr := range list.GetContainers() {
		if ctr.GetContainerId() == id || ctr.GetLabels()[LabelNetwork] != network || !holdsAll(ctr, set) {
			continue
		}
		same := true
		for _, k := range sameGroup {
			same = same && ctr.GetLabels()[LabelArgPrefix+k] == args[k]
		}
		if same {
			found = append(found, ctr.GetContainerId())
		}
	}
	switch len(found) {
	case 0:
		return "", nil, nil // nobody to take over from: a first deployment
	case 1:
		return found[0], ports, nil
	}
	return "", nil, types.NewError(types.ErrInvalidEnvironmentVariables,
		fmt.Sprintf("isolator-cni: CNI_ARGS %s=auto: %d containers of this group hold ports %s (%s); name one", ArgHandoffFrom, len(found), set, strings.Join(found, ", ")), "")
}

// checkPredecessor refuses a predecessor named by id that "auto" could
// never find: one of another network, or, when the call carries a Nomad
// namespace, of another namespace (a job may take ports over only from
// its own kind: CNI_ARGS can come from a job's own network block). An
// unknown id is left to isolatord, which names it.
func checkPredecessor(ctx context.Context, c isolatordv1grpc.IsolatorClient, args cniArgs, network, from string) error {
	got, err := c.Get(ctx, &pb.GetRequest{ContainerId: from})
	if status.Code(err) == codes.NotFound {
		return nil
	}
	if err != nil {
		return err
	}
	labels := got.GetContainer().GetLabels()
	if n := labels[LabelNetwork]; n != network {
		return types.NewError(types.ErrInvalidEnvironmentVariables,
			fmt.Sprintf("isolator-cni: CNI_ARGS %s=%s: that container is of network %q, not %q", ArgHandoffFrom, from, n, network), "")
	}
	const ns = "NOMAD_NAMESPACE"
	if want := args[ns]; want != "" && labels[LabelArgPrefix+ns] != want {
		return types.NewError(types.ErrInvalidEnvironmentVariables,
			fmt.Sprintf("isolator-cni: CNI_ARGS %s=%s: that container is of Nomad namespace %q, not %q", ArgHandoffFrom, from, labels[LabelArgPrefix+ns], want), "")
	}
	return nil
}

// holdsAll reports whether container c holds every port of set.
func holdsAll(c *pb.Container, set ephemeral.Set) bool {
	held := ephemeral.Set{}
	for _, r := range c.GetPorts() {
		held = held.Union(ephemeral.NewSet(ephemeral.Range{Begin: uint16(r.GetBegin()), End: uint16(r.GetEnd())}))
	}
	return held.ContainsSet(set)
}
