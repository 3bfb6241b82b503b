package main

import (
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"
)

// After ADD and DEL the CNI SDK's skel checks that CNI_NETNS is not the
// plugin's own network namespace (unless the runtime set
// CNI_NETNS_OVERRIDE), finding the plugin's namespace on a locked OS
// thread: the Go runtime's first lock starts a thread of its own (the
// template thread), a cost of every ADD and DEL in a plugin that otherwise
// never locks one. The plugin makes the same check, at the same point and
// with the same errors, from /proc/thread-self/ns/net: every unlocked
// thread of the plugin is in its own namespace (only readNSIface enters
// another, on a locked thread that is unlocked only once back). main then
// tells skel, through CNI_NETNS_OVERRIDE, that the check is made.

// netnsOverride reports whether CNI_NETNS_OVERRIDE's value turns the
// check off, as skel reads it.
func netnsOverride(v string) bool { return strings.ToUpper(v) == "TRUE" || v == "1" }

// netnsChecked is verb followed, when it succeeds, by the check, unless
// override (the runtime's CNI_NETNS_OVERRIDE).
func netnsChecked(verb func(*skel.CmdArgs) error, override bool) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) error {
		if err := verb(args); err != nil {
			return err
		}
		if override {
			return nil
		}
		return checkNotOwnNetNS(args.Netns)
	}
}

// checkNotOwnNetNS fails (code 8) when the namespace at path is the
// plugin's own. A path that does not lead to a file (a DEL after the
// namespace is gone, no CNI_NETNS) is not, as for skel.
func checkNotOwnNetNS(path string) error {
	var ns, own unix.Stat_t
	if unix.Stat(path, &ns) != nil {
		return nil
	}
	if err := unix.Stat("/proc/thread-self/ns/net", &own); err != nil {
		return types.NewError(types.ErrInvalidNetNS, "get plugin's netns failed", "")
	}
	if ns.Dev == own.Dev && ns.Ino == own.Ino {
		return types.NewError(types.ErrInvalidNetNS, "plugin's netns and netns from CNI_NETNS should not be the same", "")
	}
	return nil
}
