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

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/nshandle"
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

// EnsureSharedDir creates dir and makes it a mount point with shared
// propagation, as iproute2 does for /var/run/netns: bind dir onto itself,
// then mark it MS_SHARED. This makes namespace bind mounts created under it
// visible to mount namespaces that were cloned from ours (for example the
// one `ip netns exec` creates) and lets their unmounts propagate. Nothing is
// done if dir already is a shared mount point.
func EnsureSharedDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create netns dir %s: %w", dir, err)
	}
	real, err := resolveDir(dir)
	if err != nil {
		return fmt.Errorf("resolve netns dir %s: %w", dir, err)
	}
	mounts, err := ReadMountInfo()
	if err != nil {
		return fmt.Errorf("read mountinfo: %w", err)
	}
	var top *MountInfo
	for i := range mounts { // the last mount on a path is the visible one
		if mounts[i].MountPoint == real {
			top = &mounts[i]
		}
	}
	if top != nil && top.Shared() {
		return nil
	}
	if top == nil {
		if err := unix.Mount(real, real, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind netns dir %s onto itself: %w", real, err)
		}
	}
	if err := unix.Mount("none", real, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make netns dir %s shared: %w", real, err)
	}
	return nil
}

// BindMount pins namespace ns at dir/name by bind-mounting its handle onto a
// new empty file, so `ip netns exec name ...` works and the namespace lives
// on even when no process is left in it. If dir/name already is a mount of
// the same namespace, it succeeds without change; a mount of another
// namespace, or an existing non-empty file, is an error.
func BindMount(ns *nshandle.NS, dir, name string) (string, error) {
	if name == "" || strings.ContainsRune(name, '/') || name == "." || name == ".." {
		return "", fmt.Errorf("bind mount name %q is not a plain file name", name)
	}
	p := filepath.Join(dir, name)
	if cur, err := nshandle.Open(p); err == nil {
		same := cur.SameAs(ns)
		cur.Close()
		if same {
			return p, nil
		}
		return "", fmt.Errorf("%s already pins another network namespace", p)
	}
	// Create the empty mount point; an empty regular file left by an
	// interrupted run is reused.
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err == nil {
		f.Close()
	} else if st, serr := os.Lstat(p); serr != nil || !st.Mode().IsRegular() || st.Size() != 0 {
		return "", fmt.Errorf("create mount point %s: %w", p, err)
	}
	src := "/proc/self/fd/" + strconv.Itoa(ns.Fd())
	if err := unix.Mount(src, p, "none", unix.MS_BIND, ""); err != nil {
		os.Remove(p)
		return "", fmt.Errorf("bind mount %s on %s: %w", ns, p, err)
	}
	return p, nil
}

// Unmount detaches the bind mount at dir/name (MNT_DETACH) and removes the
// file. It reports whether there was a mount and whether there was a file;
// neither missing is an error.
func Unmount(dir, name string) (mounted, existed bool, err error) {
	p := filepath.Join(dir, name)
	if err := unix.Unmount(p, unix.MNT_DETACH); err == nil {
		mounted = true
	} else if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return false, true, fmt.Errorf("unmount %s: %w", p, err)
	}
	if err := os.Remove(p); err == nil {
		existed = true
	} else if !errors.Is(err, fs.ErrNotExist) {
		return mounted, true, fmt.Errorf("remove %s: %w", p, err)
	}
	return mounted, existed || mounted, nil
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
