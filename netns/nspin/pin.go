// Package nspin pins network namespaces to files by bind mounts, so
// `ip netns exec NAME` works and a namespace outlives its processes: it
// plans and makes a container's pin (its own, or a runtime's pin found
// in place), removes only the pins it made, makes the pin directory a
// shared mount point as iproute2 does, and lists the namespace mounts of
// this mount namespace (from /proc/self/mountinfo). The mount calls are in
// the _linux.go files; Pin and the mountinfo reader build anywhere. It is
// tested with real mounts of scratch namespaces (root; the tests skip
// otherwise) and a parser test of mountinfo lines.
package nspin

import (
	"fmt"
	"strconv"
	"strings"
)

// Suffix is appended to a container's name when its usual pin path
// (dir/name) is already someone else's mount of another namespace: ours
// goes to dir/name+Suffix. '@' is not allowed in container IDs, so the
// alternate name never clashes with another container's usual one.
const Suffix = "@isolatord"

// Pin is where a namespace is pinned and whether isolatord made the pin.
type Pin struct {
	Path string
	// Owned: isolatord created this mount and removes it at teardown. A
	// pin it found (a runtime's: Nomad mounts each alloc's namespace at
	// /var/run/netns/<allocID>) is used but never unmounted.
	Owned bool
}

// NetNSMounts lists every nsfs mount of a network namespace in this
// process's mount namespace: namespace inode -> mount points. A runtime's
// pin of a container's namespace shows up here wherever it is.
func NetNSMounts() (map[uint64][]string, error) {
	mounts, err := ReadMountInfo()
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	out := map[uint64][]string{}
	for _, m := range mounts {
		if m.FSType != "nsfs" || !strings.HasPrefix(m.Root, "net:[") {
			continue
		}
		ino, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(m.Root, "net:["), "]"), 10, 64)
		if err == nil {
			out[ino] = append(out[ino], m.MountPoint)
		}
	}
	return out, nil
}
