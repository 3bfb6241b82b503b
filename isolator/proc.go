package isolator

import (
	"fmt"
	"io/fs"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// procStart returns the start time (clock ticks since boot, field 22 of
// /proc/PID/stat) of a process, which together with the pid identifies it
// across pid reuse.
func procStart(procRoot string, pid int) (uint64, error) {
	b, err := readProcFile(fmt.Sprintf("%s/%d/stat", procRoot, pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	fields := strings.Fields(s[i+1:])
	// fields[0] is field 3 (state); starttime is field 22.
	if len(fields) < 20 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// alive reports whether the namespace a record was isolated into still has
// its owner: the same process (pid + start time) or the same path and inode.
func (s *Isolator) alive(r *Record) bool {
	if r.Pid > 0 {
		start, err := procStart(s.cfg.ProcRoot, r.Pid)
		return err == nil && start == r.PidStart
	}
	if r.NetNSPath == "" {
		return false
	}
	ino, err := s.dp.NetNSInode(r.NetNSPath)
	return err == nil && ino == r.NetNSIno
}

// readProcFile reads a small procfs file with plain system calls: os.ReadFile
// would first try to add the descriptor to the runtime's poller (four
// fcntl and epoll_ctl calls that fail for procfs files) and stat it.
func readProcFile(path string) ([]byte, error) {
	var fd int
	var err error
	for {
		if fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	b := make([]byte, 0, 512)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := unix.Read(fd, b[len(b):cap(b)])
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return nil, &fs.PathError{Op: "read", Path: path, Err: err}
		case n == 0:
			return b, nil
		}
		b = b[:len(b)+n]
	}
}
