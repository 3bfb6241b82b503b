package nspin

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// DefaultDir is where iproute2 looks for named network namespaces.
const DefaultDir = "/var/run/netns"

// MountInfo is one line of /proc/self/mountinfo, decoded.
type MountInfo struct {
	ID, Parent int
	Root       string // root of the mount within its filesystem (for nsfs: "net:[INODE]")
	MountPoint string
	Optional   []string // optional fields, e.g. "shared:12", "master:3"
	FSType     string
	Source     string
}

// Shared reports whether the mount has shared propagation.
func (m MountInfo) Shared() bool {
	for _, o := range m.Optional {
		if strings.HasPrefix(o, "shared:") {
			return true
		}
	}
	return false
}

// ReadMountInfo parses /proc/self/mountinfo (the mount table of this
// process's mount namespace).
func ReadMountInfo() ([]MountInfo, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []MountInfo
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		m, ok := parseMountInfoLine(sc.Text())
		if ok {
			out = append(out, m)
		}
	}
	return out, sc.Err()
}

// parseMountInfoLine decodes
// "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue".
func parseMountInfoLine(line string) (MountInfo, bool) {
	fields := strings.Fields(line)
	sep := -1
	for i, f := range fields {
		if f == "-" && i >= 6 {
			sep = i
			break
		}
	}
	if sep < 0 || len(fields) < sep+3 {
		return MountInfo{}, false
	}
	id, err1 := strconv.Atoi(fields[0])
	parent, err2 := strconv.Atoi(fields[1])
	if err1 != nil || err2 != nil {
		return MountInfo{}, false
	}
	return MountInfo{
		ID: id, Parent: parent,
		Root:       unescapeMount(fields[3]),
		MountPoint: unescapeMount(fields[4]),
		Optional:   fields[6:sep],
		FSType:     fields[sep+1],
		Source:     unescapeMount(fields[sep+2]),
	}, true
}

// unescapeMount undoes the kernel's octal escapes (\040 for space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// resolveDir makes dir absolute with symlinks resolved (/var/run -> /run),
// as mountinfo reports mount points.
func resolveDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	return filepath.EvalSymlinks(abs)
}

// NsMounts lists the entries of dir that are nsfs (namespace) mounts in this
// process's mount namespace: name -> namespace inode. Only network
// namespaces are listed when that can be told from the mount root
// ("net:[INODE]").
func NsMounts(dir string) (map[string]uint64, error) {
	real, err := resolveDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return map[string]uint64{}, nil
		}
		return nil, err
	}
	mounts, err := ReadMountInfo()
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	out := map[string]uint64{}
	for _, m := range mounts {
		if m.FSType != "nsfs" || filepath.Dir(m.MountPoint) != real {
			continue
		}
		root := m.Root
		if !strings.HasPrefix(root, "net:[") {
			continue
		}
		ino, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(root, "net:["), "]"), 10, 64)
		out[filepath.Base(m.MountPoint)] = ino
	}
	return out, nil
}
