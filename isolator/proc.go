package isolator

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// procStart returns the start time (clock ticks since boot, field 22 of
// /proc/PID/stat) of a process, which together with the pid identifies it
// across pid reuse.
func procStart(procRoot string, pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("%s/%d/stat", procRoot, pid))
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

// netnsInode identifies a network namespace file by its inode; a variable
// so that unit tests, which cannot create namespaces, can stand in for it.
var netnsInode = nsInode

// nsInode returns the inode of a network namespace file and checks that it
// is one (an nsfs file whose namespace type is CLONE_NEWNET).
func nsInode(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, err
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &fs); err != nil {
		return 0, err
	}
	if fs.Type != unix.NSFS_MAGIC {
		return 0, fmt.Errorf("not a namespace file")
	}
	t, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE)
	if err != nil {
		return 0, fmt.Errorf("namespace type: %w", err)
	}
	if t != unix.CLONE_NEWNET {
		return 0, fmt.Errorf("a namespace, but not a network namespace")
	}
	return st.Ino, nil
}

// alive reports whether the namespace a record was isolated into still has
// its owner: the same process (pid + start time) or the same path and inode.
func alive(procRoot string, r *Record) bool {
	if r.Pid > 0 {
		start, err := procStart(procRoot, r.Pid)
		return err == nil && start == r.PidStart
	}
	if r.NetNSPath == "" {
		return false
	}
	ino, err := netnsInode(r.NetNSPath)
	return err == nil && ino == r.NetNSIno
}
