package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"

	"google.golang.org/grpc/codes"

	"github.com/isolatord/isolatord/api"
	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"
)

// Plugin carries out the CNI verbs against isolatord. Its fields are the
// seams the tests replace; newPlugin gives the real ones.
type Plugin struct {
	// Dial connects to isolatord's socket; the returned func closes the
	// connection.
	Dial func(ctx context.Context, socket string) (isolatordv1grpc.IsolatorClient, func() error, error)
	// ReadNS reads an interface inside a network namespace (readNSIface).
	ReadNS func(nsPath, ifname string) (nsIface, error)
	// Stdout receives the ADD result.
	Stdout io.Writer
	// Timeout bounds ADD, CHECK, DEL and GC; StatusTimeout bounds STATUS
	// (after any wait for the daemon); DialTimeout bounds each attempt to
	// connect; DaemonWait is how long a verb waits for a daemon that is
	// down (restarting) before failing, unless the configuration's
	// "daemonWait" says otherwise (wait.go).
	Timeout, StatusTimeout, DialTimeout, DaemonWait time.Duration
}

func newPlugin(stdout io.Writer) *Plugin {
	return &Plugin{
		Dial: func(ctx context.Context, socket string) (isolatordv1grpc.IsolatorClient, func() error, error) {
			c, err := api.Dial(ctx, socket)
			if err != nil {
				return nil, nil, err
			}
			return c, c.Close, nil
		},
		ReadNS:        readNSIface,
		Stdout:        stdout,
		Timeout:       60 * time.Second,
		StatusTimeout: 5 * time.Second,
		DialTimeout:   api.DefaultDialTimeout,
		DaemonWait:    DefaultDaemonWait,
	}
}

// owner checks that a container isolatord returned belongs to this network
// and interface: the plugin never touches containers of other networks or
// containers created outside CNI.
func owner(c *pb.Container, network, ifname string) error {
	l := c.GetLabels()
	got, ok := l[LabelNetwork]
	switch {
	case !ok:
		return types.NewError(ErrContainerExists, fmt.Sprintf("container_id: %s is held by isolatord outside CNI (no %s label), not by network %q", c.GetContainerId(), LabelNetwork, network), "")
	case got != network:
		return types.NewError(ErrContainerExists, fmt.Sprintf("container_id: %s is held by isolatord for CNI network %q, not %q", c.GetContainerId(), got, network), "")
	case l[LabelIfName] != ifname:
		return types.NewError(ErrContainerExists, fmt.Sprintf("container_id: %s is attached to network %q as %q, not %q", c.GetContainerId(), network, l[LabelIfName], ifname), "")
	}
	return nil
}

// orEmpty is c, or an empty container when a reply carried none.
func orEmpty(c *pb.Container) *pb.Container {
	if c == nil {
		return &pb.Container{}
	}
	return c
}

// ownerLabels are the labels of a container that network attached as
// ifname: what owner checks, for isolatord to check in the same call.
func ownerLabels(network, ifname string) map[string]string {
	return map[string]string{LabelNetwork: network, LabelIfName: ifname}
}

// parseAttach checks what ADD and CHECK get from the runtime: the
// configuration, the container ID, the interface name and CNI_ARGS.
func parseAttach(args *skel.CmdArgs) (*NetConf, cniArgs, error) {
	conf, err := parseConfig(args.StdinData)
	if err != nil {
		return nil, nil, err
	}
	if err := checkContainerID(args.ContainerID); err != nil {
		return nil, nil, err
	}
	if err := checkIfName(args.IfName); err != nil {
		return nil, nil, err
	}
	cargs, err := parseArgs(args.Args)
	if err != nil {
		return nil, nil, err
	}
	if err := checkUTF8(args.Netns, cargs); err != nil {
		return nil, nil, err
	}
	return conf, cargs, nil
}

// Add reserves the container's ports (Prepare) and plumbs its namespace
// (Isolate), then reports eth0 with the host's address. A retried ADD for
// the same container, ports and namespace returns the same result. If
// Isolate fails, a container this ADD prepared is cleaned up again.
func (p *Plugin) Add(args *skel.CmdArgs) error {
	conf, cargs, err := parseAttach(args)
	if err != nil {
		return err
	}
	var prev *types100.Result
	if conf.PrevResult != nil {
		if prev, err = types100.NewResultFromResult(conf.PrevResult); err != nil {
			return types.NewError(types.ErrDecodingFailure, "isolator-cni: prevResult: "+err.Error(), "")
		}
		for _, i := range prev.Interfaces {
			if i != nil && i.Name == args.IfName && i.Sandbox != "" {
				return configError("an earlier plugin already created %s in the container; isolator-cni creates the container's interface itself and must come before any other interface plugin", args.IfName)
			}
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), p.Timeout)
	defer cancel()
	c, closeConn, err := p.connect(ctx, conf.Socket, p.daemonWait(conf))
	if err != nil {
		return connectError(err)
	}
	defer closeConn()

	hip, err := hostIP(ctx, c, conf)
	if err != nil {
		return err
	}
	req, err := requestedPorts(conf, cargs, hip)
	if err != nil {
		return err
	}
	from, handed, err := handoff(ctx, c, cargs, conf.Name, args.ContainerID)
	if err != nil {
		return err
	}
	att, err := c.Attach(ctx, &pb.AttachRequest{
		Prepare: &pb.PrepareRequest{
			ContainerId: args.ContainerID,
			Ports:       req.Proto(),
			Labels:      cargs.labels(conf.Name, args.IfName),
			HandoffFrom: from, HandoffPorts: handed,
		},
		Target:        &pb.AttachRequest_NetnsPath{NetnsPath: args.Netns},
		RequireLabels: ownerLabels(conf.Name, args.IfName),
	})
	if err != nil {
		return daemonError("Attach", err)
	}
	if att.GetLabelsDiffer() {
		if err := owner(att.GetContainer(), conf.Name, args.IfName); err != nil {
			return err
		}
		return types.NewError(ErrContainerExists, fmt.Sprintf("container_id: %s is held by isolatord with other labels", args.ContainerID), "")
	}
	wasIsolated := att.GetWasIsolated()

	// rollback undoes this ADD after a later step failed (isolatord undid
	// a failed Attach itself). A container that was already isolated (a
	// retried ADD) is left alone: it works, and the runtime's DEL removes
	// it; so is one no longer this network's (replaced meanwhile).
	rollback := func(cause error) error {
		if wasIsolated {
			return cause
		}
		rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer rcancel()
		if _, err := c.Cleanup(rctx, &pb.CleanupRequest{ContainerId: args.ContainerID, RequireLabels: ownerLabels(conf.Name, args.IfName)}); err != nil {
			var ce *types.Error
			if errors.As(cause, &ce) {
				ce.Details = joinDetails(ce.Details, "rollback (Cleanup) also failed: "+err.Error())
				return ce
			}
			return fmt.Errorf("%w; rollback (Cleanup) also failed: %v", cause, err)
		}
		return cause
	}

	// isolatord says what it configured when this call isolated the
	// container; for one isolated before (a retried ADD) the namespace is
	// read instead.
	ifc, ok, err := attachedIface(att.GetEth0())
	if err != nil {
		return rollback(types.NewError(types.ErrInternal, "isolator-cni: isolatord's Attach reply: "+err.Error(), ""))
	}
	if !ok {
		if ifc, err = p.ReadNS(args.Netns, ContainerIfName); err != nil {
			return rollback(types.NewError(types.ErrInternal, "isolator-cni: isolatord isolated the container, but reading its interface failed: "+err.Error(), ""))
		}
	}
	addr, ok := ifc.address(hip)
	if !ok {
		want := "IPv4 address"
		if hip != "" {
			want = "address " + hip
		}
		return rollback(types.NewError(types.ErrInternal, fmt.Sprintf("isolator-cni: %s in %s has no %s after Isolate (has %v)", ContainerIfName, args.Netns, want, ifc.Addrs), ""))
	}
	result := buildResult(prev, orEmpty(att.GetContainer()), args.IfName, args.Netns, ifc, addr)
	out, err := result.GetAsVersion(conf.CNIVersion)
	if err != nil {
		return rollback(types.NewError(types.ErrIncompatibleCNIVersion, "isolator-cni: "+err.Error(), ""))
	}
	// The runtime only learns of the container from this result: if it
	// cannot be written, nobody would ever DEL what this ADD set up.
	if err := out.PrintTo(p.Stdout); err != nil {
		return rollback(types.NewError(types.ErrIOFailure, "isolator-cni: writing the result: "+err.Error(), ""))
	}
	return nil
}

func joinDetails(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// buildResult appends the container's interfaces to prev (or starts a new
// result): the host end of the veth (no sandbox), then eth0 inside the
// namespace with the host's address, gateway and default route, and its
// IPv6 addresses and route when it has IPv6.
func buildResult(prev *types100.Result, c *pb.Container, ifname, netnsPath string, ifc nsIface, addr net.IPNet) *types100.Result {
	r := &types100.Result{CNIVersion: types100.ImplementedSpecVersion}
	if prev != nil {
		r.Interfaces = append(r.Interfaces, prev.Interfaces...)
		r.IPs = append(r.IPs, prev.IPs...)
		r.Routes = append(r.Routes, prev.Routes...)
		r.DNS = prev.DNS
	}
	if v := c.GetVeth(); v != "" {
		r.Interfaces = append(r.Interfaces, &types100.Interface{Name: v})
	}
	idx := len(r.Interfaces)
	ci := &types100.Interface{Name: ifname, Mtu: ifc.MTU, Sandbox: netnsPath}
	if len(ifc.MAC) > 0 {
		ci.Mac = ifc.MAC.String()
	}
	r.Interfaces = append(r.Interfaces, ci)
	r.IPs = append(r.IPs, &types100.IPConfig{Interface: types100.Int(idx), Address: addr, Gateway: ifc.Gateway})
	if ifc.Gateway != nil {
		r.Routes = append(r.Routes, &types.Route{
			Dst: net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
			GW:  ifc.Gateway,
		})
	}
	addIPv6(r, idx, ifc)
	return r
}

// Del removes the container from isolatord (Cleanup). It succeeds when the
// daemon does not know the container, when the container belongs to
// another network, and when its namespace is already gone (the daemon tears
// down what is left). It fails when the daemon cannot be asked: then nobody
// knows whether the ports are still held, and the runtime must retry.
func (p *Plugin) Del(args *skel.CmdArgs) error {
	conf, err := parseDelConfig(args.StdinData)
	if err != nil {
		return err
	}
	if checkContainerID(args.ContainerID) != nil || checkIfName(args.IfName) != nil {
		return nil // ADD refused it, so nothing was ever created
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.Timeout)
	defer cancel()
	c, closeConn, err := p.connect(ctx, conf.Socket, p.daemonWait(conf))
	if err != nil {
		return connectError(err)
	}
	defer closeConn()

	// One call: isolatord cleans the container up only if it is this
	// network's and interface's; otherwise it leaves it to its owner.
	_, err = c.Cleanup(ctx, &pb.CleanupRequest{ContainerId: args.ContainerID, RequireLabels: ownerLabels(conf.Name, args.IfName)})
	if err != nil && !isCode(err, codes.NotFound) {
		return daemonError("Cleanup", err)
	}
	return nil
}

// Check verifies with isolatord that the container is isolated in the
// runtime's namespace with the ports the configuration asks for, and that
// the namespace's interface matches prevResult.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	conf, cargs, err := parseAttach(args)
	if err != nil {
		return err
	}
	if conf.PrevResult == nil {
		return configError("CHECK needs prevResult (the result of ADD)")
	}
	prev, err := types100.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "isolator-cni: prevResult: "+err.Error(), "")
	}

	ctx, cancel := context.WithTimeout(context.Background(), p.Timeout)
	defer cancel()
	c, closeConn, err := p.connect(ctx, conf.Socket, p.daemonWait(conf))
	if err != nil {
		return connectError(err)
	}
	defer closeConn()

	got, err := c.Get(ctx, &pb.GetRequest{ContainerId: args.ContainerID})
	if err != nil {
		return daemonError("Get", err)
	}
	ctr := orEmpty(got.GetContainer())
	if err := owner(ctr, conf.Name, args.IfName); err != nil {
		return err
	}
	if ctr.GetState() != pb.ContainerState_CONTAINER_STATE_ISOLATED {
		return checkFailed("container %s is %s in isolatord, not isolated", args.ContainerID, api.StateName(ctr.GetState()))
	}
	if src := ctr.GetNetnsSource(); src != args.Netns {
		return checkFailed("container %s is isolated in %s, but the runtime says its namespace is %s", args.ContainerID, src, args.Netns)
	}
	hip, err := hostIP(ctx, c, conf)
	if err != nil {
		return err
	}
	want, err := requestedPorts(conf, cargs, hip)
	if err != nil {
		return err
	}
	if have := portRequestFromProto(ctr.GetPorts()); !have.Equal(want) {
		return checkFailed("container %s holds ports %s in isolatord, but the configuration and port mappings ask for %s", args.ContainerID, have, want)
	}
	return p.checkInterface(prev, ctr, args.IfName, args.Netns)
}

// checkInterface compares prevResult with the namespace.
func (p *Plugin) checkInterface(prev *types100.Result, ctr *pb.Container, ifname, netnsPath string) error {
	idx, veth := -1, ctr.GetVeth() == ""
	for i, ifc := range prev.Interfaces {
		if ifc == nil {
			continue
		}
		if ifc.Name == ifname && ifc.Sandbox == netnsPath {
			idx = i
		}
		if ifc.Sandbox == "" && ifc.Name == ctr.GetVeth() {
			veth = true
		}
	}
	if idx < 0 {
		return checkFailed("prevResult has no interface %s in %s", ifname, netnsPath)
	}
	if !veth {
		return checkFailed("prevResult lacks host interface %s, isolatord's veth for %s", ctr.GetVeth(), ctr.GetContainerId())
	}
	ifc, err := p.ReadNS(netnsPath, ifname)
	if err != nil {
		return checkFailed("%v", err)
	}
	if m := prev.Interfaces[idx].Mac; m != "" && !macEqual(m, ifc.MAC) {
		return checkFailed("%s in %s has MAC %s, prevResult says %s", ifname, netnsPath, ifc.MAC, m)
	}
	n := 0
	for _, ip := range prev.IPs {
		if ip == nil || ip.Interface == nil || *ip.Interface != idx {
			continue
		}
		n++
		found := false
		addrs, gw := ifc.family(ip.Address.IP)
		for _, a := range addrs {
			if a.IP.Equal(ip.Address.IP) && a.Mask.String() == ip.Address.Mask.String() {
				found = true
			}
		}
		if !found {
			return checkFailed("%s in %s lacks address %s from prevResult (has %s)", ifname, netnsPath, ip.Address.String(), cidrs(addrs))
		}
		if ip.Gateway != nil && !ip.Gateway.Equal(gw) {
			return checkFailed("%s in %s has default gateway %v, prevResult says %s", ifname, netnsPath, gw, ip.Gateway)
		}
	}
	if n == 0 {
		return checkFailed("prevResult has no address on %s", ifname)
	}
	return nil
}

func macEqual(s string, mac net.HardwareAddr) bool {
	m, err := net.ParseMAC(s)
	return err == nil && m.String() == mac.String()
}

func checkFailed(format string, args ...any) error {
	return types.NewError(ErrCheckFailed, "isolator-cni: CHECK: "+fmt.Sprintf(format, args...), "")
}

// GC cleans up every container isolatord holds for this network whose
// (container ID, interface) is not in cni.dev/valid-attachments. It keeps
// going past failures and reports them all. Without the attachment list it
// refuses, rather than remove every container of the network.
func (p *Plugin) GC(args *skel.CmdArgs) error {
	conf, err := parseGCConfig(args.StdinData)
	if err != nil {
		return err
	}
	if !conf.hasAttachments {
		return configError("GC without cni.dev/valid-attachments: refusing to remove every container of network %q", conf.Name)
	}
	valid := map[types.GCAttachment]bool{}
	for _, a := range conf.attachments() {
		valid[a] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.Timeout)
	defer cancel()
	c, closeConn, err := p.connect(ctx, conf.Socket, p.daemonWait(conf))
	if err != nil {
		return connectError(err)
	}
	defer closeConn()
	list, err := c.List(ctx, &pb.ListRequest{})
	if err != nil {
		return daemonError("List", err)
	}
	var failed []error
	for _, ctr := range list.GetContainers() {
		l := ctr.GetLabels()
		if l[LabelNetwork] != conf.Name {
			continue
		}
		if valid[types.GCAttachment{ContainerID: ctr.GetContainerId(), IfName: l[LabelIfName]}] {
			continue
		}
		if _, err := c.Cleanup(ctx, &pb.CleanupRequest{ContainerId: ctr.GetContainerId()}); err != nil && !isCode(err, codes.NotFound) {
			failed = append(failed, daemonError("Cleanup", err))
		}
	}
	switch len(failed) {
	case 0:
		return nil
	case 1:
		return failed[0]
	}
	code := types.ErrInternal
	var first *types.Error
	if errors.As(failed[0], &first) {
		code = first.Code
	}
	return types.NewError(code, fmt.Sprintf("isolator-cni: GC: %d cleanups failed: %v", len(failed), errors.Join(failed...)), "")
}

// Status reports whether isolatord answers: error 50 (plugin not
// available) when it does not, within StatusTimeout.
func (p *Plugin) Status(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.StatusTimeout+p.daemonWait(conf))
	defer cancel()
	c, closeConn, err := p.connect(ctx, conf.Socket, p.daemonWait(conf))
	if err != nil {
		return types.NewError(types.ErrPluginNotAvailable, "isolatord is not available: "+err.Error(), "")
	}
	defer closeConn()
	if _, err := c.Status(ctx, &pb.StatusRequest{}); err != nil {
		return types.NewError(types.ErrPluginNotAvailable, "isolatord at "+conf.Socket+" did not answer Status: "+err.Error(), "")
	}
	return nil
}
