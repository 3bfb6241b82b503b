package nspin

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/nshandle"
)

// EnsureSharedDir creates dir and makes it a mount point with shared
// propagation, as iproute2 does for /var/run/netns: bind dir onto itself,
// then mark it MS_SHARED. This makes namespace bind mounts created under it
// visible to mount namespaces that were cloned from ours (for example the
// one `ip netns exec` creates) and lets their unmounts propagate. Nothing is
// done if dir already is a shared mount point.
func EnsureSharedDir(dir string) error {
	_, serr := os.Stat(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create netns dir %s: %w", dir, err)
	}
	if errors.Is(serr, fs.ErrNotExist) {
		// iproute2's mode whatever the umask (the unit has UMask=0077).
		if err := os.Chmod(dir, 0o755); err != nil {
			return fmt.Errorf("create netns dir %s: %w", dir, err)
		}
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
	// (unix.Open: os.OpenFile would also try to add the descriptor to the
	// runtime's poller, four system calls that fail for a regular file.)
	fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_RDONLY|unix.O_CLOEXEC, 0o444)
	if err == nil {
		unix.Close(fd)
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
