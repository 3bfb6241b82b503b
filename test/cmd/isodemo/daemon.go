package main

import "github.com/isolatord/isolatord/test/daemonproc"

// daemon is isolatord as the demo runs it: in the sandbox's host network
// namespace through nsenter, so the namespace handles it mounts under
// /var/run/netns are visible to `ip netns exec` (test/daemonproc).
type daemon = daemonproc.Process
