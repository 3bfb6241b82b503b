package dataplane

import (
	"encoding/binary"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ethtool ioctl constants (linux/ethtool.h, linux/sockios.h).
const (
	ethtoolGSET   = 0x00000001 // ETHTOOL_GSET: struct ethtool_cmd
	speedUnknown  = 0xffffffff // SPEED_UNKNOWN (-1)
	ethtoolCmdLen = 44         // sizeof(struct ethtool_cmd)
)

// linkSpeedHere returns the speed of link name in the calling thread's
// network namespace in Mbit/s, through SIOCETHTOOL ETHTOOL_GSET; 0 when the
// driver does not know it (virtio and most virtual NICs) or does not say.
// veth reports 10000.
func linkSpeedHere(name string) (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	cmd := new([ethtoolCmdLen]byte) // on the heap: the kernel writes it through a pointer the GC cannot see
	binary.NativeEndian.PutUint32(cmd[0:], ethtoolGSET)
	// struct ifreq: the name, then (in the union) a pointer to the command
	var ifr [40]byte
	copy(ifr[:unix.IFNAMSIZ-1], name)
	*(*uintptr)(unsafe.Pointer(&ifr[unix.IFNAMSIZ])) = uintptr(unsafe.Pointer(&cmd[0]))
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr[0])))
	runtime.KeepAlive(cmd)
	if errno == unix.EOPNOTSUPP || errno == unix.ENOTSUP {
		return 0, nil
	}
	if errno != 0 {
		return 0, errno
	}
	speed := uint32(binary.NativeEndian.Uint16(cmd[12:])) | uint32(binary.NativeEndian.Uint16(cmd[28:]))<<16
	if speed == speedUnknown || speed == 0xffff {
		return 0, nil
	}
	return uint64(speed), nil
}
