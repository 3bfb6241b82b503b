package dataplane

import (
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/nspin"
)

// NetNSInode returns the inode of a network namespace file, refusing
// anything that is not one.
func (d *DataPlane) NetNSInode(path string) (uint64, error) {
	ns, err := nshandle.Open(path)
	if err != nil {
		return 0, err
	}
	defer ns.Close()
	return ns.Ino(), nil
}

// NetNSMounts lists the mount points of every mounted network namespace,
// by inode (from the mount table).
func (d *DataPlane) NetNSMounts() (map[uint64][]string, error) {
	return nspin.NetNSMounts()
}
