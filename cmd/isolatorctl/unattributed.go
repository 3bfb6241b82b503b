package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/isolatord/isolatord/api"
	isolatordv1 "github.com/isolatord/isolatord/api/isolatord/v1"
)

// remove-unattributed: the operator's explicit removal of kernel objects
// that belong to no container (the daemon leaves them in place and lists
// them in `isolatorctl status`).
func init() {
	commands = append(commands, &command{
		name:    "remove-unattributed",
		summary: "remove kernel objects of isolatord's shape that belong to no container (listed by status)",
		setup: func(*flag.FlagSet) func(string) (call, error) {
			return func(string) (call, error) {
				return func(ctx context.Context, c *api.Client) (result, error) {
					resp, err := c.RemoveUnattributed(ctx, &isolatordv1.RemoveUnattributedRequest{})
					return removedResult(resp.GetRemoved()), err
				}, nil
			}
		},
	})
}

type removedResult []string

func (r removedResult) jsonValue() any {
	return jsonOf(&isolatordv1.RemoveUnattributedResponse{Removed: r})
}

func (r removedResult) writeTable(w io.Writer) error {
	if len(r) == 0 {
		_, err := fmt.Fprintln(w, "Nothing to remove")
		return err
	}
	for _, x := range r {
		if _, err := fmt.Fprintln(w, "Removed", x); err != nil {
			return err
		}
	}
	return nil
}

// writeRecovery prints what start-up recovery left for the operator.
func writeRecovery(w io.Writer, s *isolatordv1.StatusResponse) {
	if p := s.GetStateMovedAside(); p != "" {
		fmt.Fprintf(w, "Corrupt state moved to:\t%s\n", p)
	}
	if n := len(s.GetRebuilt()); n > 0 {
		fmt.Fprintf(w, "Rebuilt from the kernel:\t%d containers\n", n)
	}
	if len(s.GetUnattributed()) == 0 {
		fmt.Fprintf(w, "Unattributed:\tnone\n")
		return
	}
	for i, x := range s.GetUnattributed() {
		label := ""
		if i == 0 {
			label = "Unattributed (left in place):"
		}
		fmt.Fprintf(w, "%s\t%s\n", label, x)
	}
}
