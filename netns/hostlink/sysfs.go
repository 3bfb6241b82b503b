package hostlink

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/nshandle"
)

// SysNet reads device counters from a sysfs mounted for one network
// namespace. Unlike a netlink RTM_GETLINK, reading
// /sys/class/net/<dev>/statistics/* takes no rtnl (the kernel reads the
// counters under RCU), so it does not queue behind the link and filter
// changes of other callers. The figures are the same dev_get_stats ones.
type SysNet struct {
	dir *os.File // class/net of a sysfs tagged with the namespace
}

// OpenSysNet creates a sysfs for the network namespace ns, detached (no
// mount point, no change to any mount namespace: fsopen/fsmount), and
// keeps a handle on its class/net directory; the sysfs lives as long as
// the handle. A sysfs shows the devices of the namespace its creator was
// in, so it is created inside ns.
func OpenSysNet(ns *nshandle.NS) (*SysNet, error) {
	var f *os.File
	err := ns.Do(func() error {
		fsfd, err := unix.Fsopen("sysfs", unix.FSOPEN_CLOEXEC)
		if err != nil {
			return fmt.Errorf("fsopen sysfs: %w", err)
		}
		defer unix.Close(fsfd)
		if err := unix.FsconfigCreate(fsfd); err != nil {
			return fmt.Errorf("create sysfs: %w", err)
		}
		attrs := unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC
		mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, attrs)
		if err != nil {
			return fmt.Errorf("fsmount sysfs: %w", err)
		}
		defer unix.Close(mfd)
		fd, err := unix.Openat(mfd, "class/net", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("sysfs class/net: %w", err)
		}
		f = os.NewFile(uintptr(fd), "sysfs class/net")
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &SysNet{dir: f}, nil
}

// Close releases the handle (and with it the mount).
func (s *SysNet) Close() error { return s.dir.Close() }

// PeerCounters reads the counters of the host end dev of a veth and
// returns them from the peer's point of view, as PeerCounters does.
func (s *SysNet) PeerCounters(dev string) (Counters, error) {
	if dev == "" || strings.ContainsAny(dev, "/\x00") || dev == "." || dev == ".." {
		return Counters{}, fmt.Errorf("link %q: not a device name", dev)
	}
	names := [8]string{"tx_bytes", "tx_packets", "tx_errors", "tx_dropped",
		"rx_bytes", "rx_packets", "rx_errors", "rx_dropped"}
	var v [8]uint64
	var buf [32]byte
	for i, n := range names {
		fd, err := unix.Openat(int(s.dir.Fd()), dev+"/statistics/"+n, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return Counters{}, fmt.Errorf("link %s: %s: %w", dev, n, err)
		}
		k, err := unix.Read(fd, buf[:])
		unix.Close(fd)
		if err == nil && k <= 0 {
			err = errors.New("empty")
		}
		if err != nil {
			return Counters{}, fmt.Errorf("link %s: %s: %w", dev, n, err)
		}
		if v[i], err = strconv.ParseUint(strings.TrimSpace(string(buf[:k])), 10, 64); err != nil {
			return Counters{}, fmt.Errorf("link %s: %s: %w", dev, n, err)
		}
	}
	runtime.KeepAlive(s.dir)
	return Counters{
		RxBytes: v[0], RxPackets: v[1], RxErrors: v[2], RxDropped: v[3],
		TxBytes: v[4], TxPackets: v[5], TxErrors: v[6], TxDropped: v[7],
	}, nil
}
