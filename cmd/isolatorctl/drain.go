package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/isolatord/isolatord/api"
	isolatordv1 "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/ephemeral"
)

// drainPoll is how often `drain --wait` asks how many flows are left.
const drainPoll = 200 * time.Millisecond

func init() {
	commands = append(commands, &command{
		name:     "drain",
		synopsis: "ID --port LIST [--undo] [--wait [--deadline D]]",
		summary:  "stop new flows to the container on static ports, keeping its live ones (docs/handoff.md)",
		takesID:  true,
		setup: func(fs *flag.FlagSet) func(string) (call, error) {
			ports := fs.String("port", "", "the static ports to drain, a `LIST` such as 8080,8443")
			undo := fs.Bool("undo", false, "take the container out of draining instead")
			wait := fs.Bool("wait", false, "wait until no flow of the container is left on the ports")
			deadline := fs.Duration("deadline", 0, "cut the container's flows left on the ports after `D` (whole seconds, rounded up); with --wait, waits at most D and 10s more")
			return func(id string) (call, error) {
				set, err := ephemeral.ParseSet(*ports)
				if err != nil {
					return nil, fmt.Errorf("--port: %w", err)
				}
				if set.Empty() {
					return nil, errors.New("--port: give the ports to drain")
				}
				if *deadline < 0 || *deadline > 0 && *undo {
					return nil, errors.New("--deadline: a positive duration, not with --undo")
				}
				if *wait && *undo {
					return nil, errors.New("--wait: nothing to wait for with --undo")
				}
				req := &isolatordv1.DrainRequest{ContainerId: id, Undo: *undo, DeadlineSeconds: uint32((*deadline + time.Second - 1) / time.Second)}
				for _, p := range set.Ports() {
					req.Ports = append(req.Ports, uint32(p))
				}
				return func(ctx context.Context, c *api.Client) (result, error) {
					resp, err := c.Drain(ctx, req)
					if err != nil || !*wait {
						return containerResult{resp.GetContainer()}, err
					}
					if *deadline > 0 {
						var cancel context.CancelFunc
						ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), *deadline+10*time.Second)
						defer cancel()
					}
					return waitDrained(ctx, c, id, set)
				}, nil
			}
		},
	})
}

// waitDrained polls Get until no flow is left on ports.
func waitDrained(ctx context.Context, c *api.Client, id string, ports ephemeral.Set) (result, error) {
	t := time.NewTicker(drainPoll)
	defer t.Stop()
	for {
		resp, err := c.Get(ctx, &isolatordv1.GetRequest{ContainerId: id})
		if err != nil {
			return nil, err
		}
		left := 0
		for _, d := range resp.GetContainer().GetDraining() {
			if ports.Contains(uint16(d.GetPort())) {
				left += int(d.GetLiveFlows())
			}
		}
		if left == 0 {
			return containerResult{resp.GetContainer()}, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("drain of %s not done: %d flows left on %s", id, left, ports)
		case <-t.C:
		}
	}
}

// drainingString renders the ports a container drains, with their flows
// left: "8080 (3 flows)".
func drainingString(ds []*isolatordv1.DrainingPort) string {
	var parts []string
	for _, d := range ds {
		parts = append(parts, fmt.Sprintf("%d (%s left)", d.GetPort(), plural(uint64(d.GetLiveFlows()), "flow")))
	}
	return strings.Join(parts, ", ")
}

// writeDrain adds the drain and handoff lines of a container's table (only
// when there is something to say).
func writeDrain(w io.Writer, c *isolatordv1.Container) {
	if ds := c.GetDraining(); len(ds) > 0 {
		fmt.Fprintf(w, "Draining:\t%s\n", drainingString(ds))
	}
	if from := c.GetHandoffFrom(); from != "" {
		fmt.Fprintf(w, "Handoff from:\t%s, ports %v (once isolated)\n", from, c.GetHandoffPorts())
	}
}

// drainingSuffix marks drained ports in a list row: " (draining 8080:3)".
func drainingSuffix(c *isolatordv1.Container) string {
	var parts []string
	for _, d := range c.GetDraining() {
		parts = append(parts, fmt.Sprintf("%d:%d", d.GetPort(), d.GetLiveFlows()))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (draining " + strings.Join(parts, ",") + ")"
}

// handoffFlags are prepare's --handoff-from and --handoff-ports.
type handoffFlags struct{ from, ports string }

func addHandoffFlags(fs *flag.FlagSet) *handoffFlags {
	h := &handoffFlags{}
	fs.StringVar(&h.from, "handoff-from", "", "the predecessor `ID` that hands --handoff-ports over once this container is isolated")
	fs.StringVar(&h.ports, "handoff-ports", "", "the ports (a `LIST`, among --ports/--shared-ports) the predecessor hands over")
	return h
}

func (h *handoffFlags) parse() (string, []uint32, error) {
	set, err := ephemeral.ParseSet(h.ports)
	if err != nil {
		return "", nil, fmt.Errorf("--handoff-ports: %w", err)
	}
	if (h.from == "") != set.Empty() {
		return "", nil, errors.New("--handoff-from and --handoff-ports go together")
	}
	var out []uint32
	for _, p := range set.Ports() {
		out = append(out, uint32(p))
	}
	return h.from, out, nil
}
