package e2e

// Helpers of the Docker tests (docker_test.go): a dockerd of the test's
// own (Debian 12's docker.io, Engine 20.10) whose network namespace is the
// sandbox host's, with its own data root, exec root, socket and pid file,
// no bridge and no iptables, stopped by pid; an image made with `docker
// import` of the busybox rootfs (no registry); the plugin socket under
// /run/docker/plugins (the one directory 20.10 looks in) with a unique
// name, removed afterwards.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/isolatord/isolatord/test/daemonproc"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

const (
	dockerdBin = "/usr/sbin/dockerd"
	dockerBin  = "/usr/bin/docker" // the packaged 20.10 CLI, not a newer one on PATH
)

// needDocker skips unless root and Debian's docker.io are there.
func needDocker(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("Docker tests need root")
	}
	for _, p := range []string{dockerdBin, dockerBin, "/bin/busybox"} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("%s is not installed (make deps installs docker.io and busybox-static): %v", p, err)
		}
	}
	needTools(t, "runc", "containerd", "tar")
}

type dockerd struct {
	t       testing.TB
	sb      *sandbox.Sandbox
	dir     string
	sock    string
	pidfile string
	cmd     *exec.Cmd
	done    chan struct{}
	log     *os.File
}

// startDockerd starts a dockerd of the test's own in sb's host namespace.
func startDockerd(t testing.TB, sb *sandbox.Sandbox) *dockerd {
	t.Helper()
	dir := runtimeDir(t, "dockerd")
	k := &dockerd{t: t, sb: sb, dir: dir, sock: filepath.Join(dir, "docker.sock"), pidfile: filepath.Join(dir, "docker.pid")}
	if err := os.MkdirAll(filepath.Join(dir, "cli"), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "dockerd.log"))
			t.Logf("dockerd log (tail):\n%s", daemonproc.Indent(daemonproc.Tail(string(b), 40), "    "))
		}
		k.stop()
		k.endShims()
	})
	k.start()
	return k
}

func (k *dockerd) start() {
	t := k.t
	t.Helper()
	log, err := os.OpenFile(filepath.Join(k.dir, "dockerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	k.log = log
	k.cmd = exec.Command("nsenter", "--net="+k.sb.Host.Path, dockerdBin,
		"--data-root", filepath.Join(k.dir, "data"),
		"--exec-root", filepath.Join(k.dir, "exec"),
		"-H", "unix://"+k.sock,
		"--pidfile", k.pidfile,
		"--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false",
		"--storage-driver=vfs", "--log-level=debug")
	k.cmd.Stdout, k.cmd.Stderr = log, log
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := k.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	k.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(k.cmd, k.done)
	ok := wait.Until(60*time.Second, func() bool {
		select {
		case <-k.done:
			return true
		default:
		}
		_, err := k.run(10*time.Second, "version")
		return err == nil
	})
	select {
	case <-k.done:
		t.Fatalf("dockerd exited at start; its log:\n%s", k.logTail())
	default:
	}
	if !ok {
		t.Fatalf("dockerd did not answer within 60s; its log:\n%s", k.logTail())
	}
}

func (k *dockerd) logTail() string {
	b, _ := os.ReadFile(filepath.Join(k.dir, "dockerd.log"))
	return daemonproc.Indent(daemonproc.Tail(string(b), 30), "    ")
}

// stop ends dockerd by its pid (SIGTERM, then SIGKILL after 30s) and its
// containerd with it.
func (k *dockerd) stop() {
	if k.cmd == nil || k.cmd.Process == nil {
		return
	}
	select {
	case <-k.done:
		return
	default:
	}
	_ = k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.done:
	case <-time.After(30 * time.Second):
		_ = k.cmd.Process.Kill()
		<-k.done
	}
	k.log.Close()
}

// kill kills dockerd with SIGKILL: its containerd dies with it (dockerd
// starts it with a parent-death signal), its containers outlive it in
// their shims. The containerd pid file is removed once its process is
// gone: a new process may take the pid, and dockerd would wait for it.
func (k *dockerd) kill() {
	_ = k.cmd.Process.Kill()
	<-k.done
	k.log.Close()
	pidfile := filepath.Join(k.dir, "exec", "containerd", "containerd.pid")
	b, err := os.ReadFile(pidfile)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return
	}
	if !wait.Until(10*time.Second, func() bool { return !ourProcess(pid, k.dir) }) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		wait.Until(10*time.Second, func() bool { return !ourProcess(pid, k.dir) })
	}
	os.Remove(pidfile)
}

// ourProcess reports whether pid is a live process whose command line
// names dir (one this dockerd started: its containerd or a shim).
func ourProcess(pid int, dir string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err == nil {
		if f := strings.Fields(string(st)); len(f) > 2 && f[2] == "Z" {
			return false
		}
	}
	return strings.Contains(string(b), dir+"/")
}

// inContainerOf reports whether pid is a live process in a mount
// namespace of its own (not ours: our namespace may still hold mounts under
// dir) with a mount under dir: a container of the dockerd whose directory
// dir is.
func inContainerOf(pid int, dir string) bool {
	ours, err1 := os.Readlink("/proc/self/ns/mnt")
	its, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err1 != nil || err2 != nil || ours == its {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	return err == nil && strings.Contains(string(b), dir+"/")
}

// endShims kills what this dockerd left running after it stopped:
// processes whose command line names its directory (shims whose
// containerd died with a killed dockerd) and containers' processes (their
// mounts are under its directory).
func (k *dockerd) endShims() {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if ourProcess(pid, k.dir) || inContainerOf(pid, k.dir) {
			k.t.Logf("killing pid %d left by the test's dockerd", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// restart stops dockerd and starts it again on the same roots.
func (k *dockerd) restart() {
	k.t.Helper()
	k.stop()
	k.start()
}

// run runs the docker CLI against this dockerd.
func (k *dockerd) run(timeout time.Duration, args ...string) (string, error) {
	return runCmd(timeout, []string{"DOCKER_CONFIG=" + filepath.Join(k.dir, "cli")}, dockerBin, append([]string{"-H", "unix://" + k.sock}, args...)...)
}

// must runs the docker CLI and fails the test on error.
func (k *dockerd) must(args ...string) string {
	k.t.Helper()
	out, err := k.run(90*time.Second, args...)
	if err != nil {
		k.t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(out)
}

// importImage makes image name from the busybox rootfs (with
// /isotraffic) with `docker import`.
func (k *dockerd) importImage(name string) {
	k.t.Helper()
	root := buildRootfs(k.t, k.t.TempDir())
	tarball := filepath.Join(k.t.TempDir(), "rootfs.tar")
	if out, err := runCmd(60*time.Second, nil, "tar", "-C", root, "-cf", tarball, "."); err != nil {
		k.t.Fatalf("tar: %v\n%s", err, out)
	}
	k.must("import", "-c", `CMD ["/bin/sh"]`, tarball, name)
}

// pluginSocket is a unique plugin socket under /run/docker/plugins (its
// file name is the driver's name), removed when the test ends.
func pluginSocket(t testing.TB, sb *sandbox.Sandbox) (path, driver string) {
	t.Helper()
	driver = "isot" + strconv.FormatInt(int64(os.Getpid()), 36) + strings.ReplaceAll(sb.Name, "-", "")
	if len(driver) > 40 {
		driver = driver[:40]
	}
	path = filepath.Join("/run/docker/plugins", driver+".sock")
	t.Cleanup(func() { os.Remove(path) })
	return path, driver
}

// dockerState is what a Docker test checks is gone after rm: isolatord's
// containers, our veths (host ends and staged peers) in the sandbox host.
func dockerLeftovers(t testing.TB, sb *sandbox.Sandbox, d *Daemon) string {
	t.Helper()
	var list []ctlContainer
	d.CtlJSON(t, &list, "list")
	var left []string
	for _, c := range list {
		left = append(left, "container "+c.ContainerID)
	}
	out := sb.Host.Run(t, "ip", "-o", "link", "show")
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && (strings.HasPrefix(f[1], "iso") || strings.HasPrefix(f[1], "isd")) {
			left = append(left, "link "+strings.TrimSuffix(f[1], ":"))
		}
	}
	if len(left) == 0 {
		return ""
	}
	return fmt.Sprint(left)
}
