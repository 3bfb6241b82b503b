package isolator

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/isolatord/isolatord/nshandle"
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

// nsInode returns the inode of a network namespace file, refusing anything
// that is not one.
func nsInode(path string) (uint64, error) {
	ns, err := nshandle.Open(path)
	if err != nil {
		return 0, err
	}
	defer ns.Close()
	return ns.Ino(), nil
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
