package packaging

// The Debian package (make deb, scripts/build-deb.sh): built, checked with
// lintian and systemd-analyze, installed with dpkg -i and purged on this
// machine. Installing never starts isolatord: the install part runs only
// when systemd is not the running init (then no maintainer script starts a
// unit), and the test never connects to the installed socket.

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// maxExposure is the highest systemd-analyze security exposure the unit may
// have (9.6 "UNSAFE" before hardening).
const maxExposure = 6.0

// mountNamespaceOptions are the unit settings for which systemd gives the
// service a mount namespace of its own (src/core/execute.c,
// exec_needs_mount_namespace, systemd 252): with any of them, isolatord's
// bind mounts under /var/run/netns would be invisible to `ip netns`. The
// value that leaves the namespace alone is given where there is one.
var mountNamespaceOptions = map[string][]string{
	"ProtectSystem": {"no", "false"}, "ProtectHome": {"no", "false"},
	"PrivateTmp": {"no", "false"}, "PrivateDevices": {"no", "false"},
	"PrivateMounts": {"no", "false"}, "PrivateIPC": {"no", "false"},
	"PrivateNetwork": {"no", "false"}, "ProtectKernelTunables": {"no", "false"},
	"ProtectKernelModules": {"no", "false"}, "ProtectKernelLogs": {"no", "false"},
	"ProtectControlGroups": {"no", "false"}, "ProtectProc": {"default"},
	"ProcSubset": {"all"}, "MountFlags": {"shared", ""},
	"DynamicUser": {"no", "false"}, "ReadWritePaths": nil, "ReadOnlyPaths": nil,
	"InaccessiblePaths": nil, "ExecPaths": nil, "NoExecPaths": nil,
	"BindPaths": nil, "BindReadOnlyPaths": nil, "TemporaryFileSystem": nil,
	"RootDirectory": nil, "RootImage": nil, "MountImages": nil,
	"ExtensionImages": nil, "ExtensionDirectories": nil, "LogNamespace": nil,
	"NetworkNamespacePath": nil, "IPCNamespacePath": nil, "MountAPIVFS": {"no", "false"},
}

func TestDebPackage(t *testing.T) {
	if testing.Short() {
		t.Skip("needs root (dpkg -i, purge): not a unit test (-short)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: the package is installed with dpkg -i and purged")
	}
	for _, tool := range []string{"dpkg-deb", "dpkg", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (package dpkg; scripts/install-deps.sh)", tool)
		}
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	stamp := strings.TrimSpace(run(t, root, nil, "git", "describe", "--tags", "--always", "--dirty"))
	out := t.TempDir()
	start := time.Now()
	built := run(t, root, []string{"VERSION=" + stamp}, filepath.Join(root, "scripts", "build-deb.sh"), out)
	t.Logf("make deb: %v", time.Since(start).Round(time.Millisecond))
	lines := strings.Split(strings.TrimSpace(built), "\n")
	deb := lines[len(lines)-1]

	// The name carries the Debian version the stamp maps to and the arch.
	debver := strings.TrimSpace(run(t, root, nil, filepath.Join(root, "scripts", "build-deb.sh"), "--debversion", stamp))
	arch := strings.TrimSpace(run(t, root, nil, "dpkg", "--print-architecture"))
	if want := filepath.Join(out, "isolatord_"+debver+"_"+arch+".deb"); deb != want {
		t.Fatalf("package %s, want %s", deb, want)
	}
	if v := strings.TrimSpace(run(t, root, nil, "dpkg-deb", "-f", deb, "Version")); v != debver {
		t.Errorf("control Version %q, want %q", v, debver)
	}

	x := t.TempDir()
	run(t, root, nil, "dpkg-deb", "-R", deb, x)
	for _, f := range []string{
		"usr/sbin/isolatord", "usr/bin/isolatorctl", "usr/lib/cni/isolator-cni",
		"lib/systemd/system/isolatord.service", "lib/systemd/system/isolatord.socket",
		"etc/default/isolatord", "etc/isolatord/isolatord.conf",
		"usr/share/doc/isolatord/copyright", "usr/share/doc/isolatord/changelog.Debian.gz",
		"usr/share/doc/isolatord/examples/10-isolator.conflist",
		"usr/share/doc/isolatord/examples/grafana-dashboard.json",
		"usr/share/man/man8/isolatord.8.gz", "usr/share/man/man1/isolatorctl.1.gz",
		"usr/share/man/man8/isolator-cni.8.gz",
		"DEBIAN/postinst", "DEBIAN/prerm", "DEBIAN/postrm",
	} {
		if _, err := os.Stat(filepath.Join(x, f)); err != nil {
			t.Errorf("package lacks %s", f)
		}
	}
	conffiles, _ := os.ReadFile(filepath.Join(x, "DEBIAN", "conffiles"))
	if got := string(conffiles); got != "/etc/default/isolatord\n/etc/isolatord/isolatord.conf\n" {
		t.Errorf("conffiles %q", got)
	}
	unit := filepath.Join(x, "lib", "systemd", "system", "isolatord.service")
	checkNoMountNamespace(t, unit)

	t.Run("lintian", func(t *testing.T) {
		if _, err := exec.LookPath("lintian"); err != nil {
			t.Skip("lintian not installed (scripts/install-deps.sh installs it)")
		}
		cmd := exec.Command("lintian", "--fail-on", "error", "--display-level", ">=pedantic", deb)
		b, err := cmd.CombinedOutput()
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "E:") {
				t.Errorf("lintian: %s", l)
			} else if len(l) > 2 && l[1] == ':' {
				t.Logf("lintian: %s", l)
			}
		}
		if err != nil && !t.Failed() {
			t.Errorf("lintian: %v\n%s", err, b)
		}
	})
	t.Run("exposure", func(t *testing.T) {
		if e := exposure(t, unit); e > maxExposure {
			t.Errorf("systemd-analyze security: exposure %.1f, want at most %.1f", e, maxExposure)
		}
	})
	t.Run("install", func(t *testing.T) { testInstall(t, root, deb, stamp) })
}

// testInstall installs the package with dpkg -i, checks what it put in
// place, reinstalls it (an upgrade: postinst configure with the old
// version), and purges it twice: once with a container recorded as held
// (the state directory stays) and once without (it goes). The machine is
// left as it was.
func testInstall(t *testing.T, root, deb, stamp string) {
	if comm, _ := os.ReadFile("/proc/1/comm"); strings.TrimSpace(string(comm)) == "systemd" {
		t.Skip("PID 1 is systemd: installing would start isolatord.socket (and isolatord in the root network namespace on the first call); install test skipped")
	}
	if _, err := os.Stat("/run/systemd/system"); err == nil {
		t.Skip("/run/systemd/system exists: the maintainer scripts would start the units; install test skipped")
	}
	if exec.Command("dpkg", "-s", "isolatord").Run() == nil {
		t.Skip("package isolatord is installed on this machine: not touching it")
	}
	for _, p := range []string{"/var/lib/isolatord", "/etc/isolatord", "/etc/default/isolatord", "/usr/sbin/isolatord", "/usr/bin/isolatorctl", "/usr/lib/cni/isolator-cni"} {
		if _, err := os.Lstat(p); err == nil {
			t.Skipf("%s exists: a purge would remove it; install test skipped", p)
		}
	}
	optBefore := exists("/opt/cni/bin")
	optLinkBefore := exists("/opt/cni/bin/isolator-cni")
	t.Cleanup(func() {
		if exec.Command("dpkg", "-s", "isolatord").Run() == nil {
			if b, err := exec.Command("dpkg", "--purge", "isolatord").CombinedOutput(); err != nil {
				t.Errorf("cleanup: dpkg --purge isolatord: %v\n%s", err, b)
			}
		}
		os.RemoveAll("/var/lib/isolatord") // absent before (checked above)
	})
	env := []string{"DEBIAN_FRONTEND=noninteractive"}
	run(t, root, env, "dpkg", "-i", deb)
	noDaemon(t)

	for _, c := range []struct{ bin, want string }{
		{"/usr/sbin/isolatord", "isolatord " + stamp},
		{"/usr/bin/isolatorctl", "isolatorctl " + stamp},
		{"/usr/lib/cni/isolator-cni", "CNI plugin isolator-cni " + stamp},
	} {
		// --version prints and exits before anything else (no socket, no
		// namespace touched).
		if got := run(t, root, nil, c.bin, "--version"); !strings.Contains(got, c.want) {
			t.Errorf("%s --version: %q, want %q", c.bin, got, c.want)
		}
	}
	if !optLinkBefore {
		if l, err := os.Readlink("/opt/cni/bin/isolator-cni"); err != nil || l != "/usr/lib/cni/isolator-cni" {
			t.Errorf("/opt/cni/bin/isolator-cni: %q %v, want a link to /usr/lib/cni/isolator-cni", l, err)
		}
	}
	if _, err := os.Lstat("/etc/systemd/system/sockets.target.wants/isolatord.socket"); err != nil {
		t.Errorf("isolatord.socket not enabled: %v", err)
	}
	if cf := run(t, root, nil, "dpkg-query", "-W", "-f=${Conffiles}", "isolatord"); !strings.Contains(cf, "/etc/default/isolatord") || !strings.Contains(cf, "/etc/isolatord/isolatord.conf") {
		t.Errorf("conffiles registered: %q", cf)
	}
	verifyUnits(t)
	if e := exposure(t, "/lib/systemd/system/isolatord.service"); e > maxExposure {
		t.Errorf("installed unit: exposure %.1f, want at most %.1f", e, maxExposure)
	}

	// Upgrade (same version again): the scripts run with the old version
	// and nothing fails or starts.
	run(t, root, env, "dpkg", "-i", deb)
	noDaemon(t)

	// Purge with a container recorded as held at remove: the state stays.
	if err := os.MkdirAll("/var/lib/isolatord", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("/var/lib/isolatord/held-at-remove", []byte("c1 isolated\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	msg := run(t, root, env, "dpkg", "--purge", "isolatord")
	if !exists("/var/lib/isolatord/held-at-remove") {
		t.Error("purge removed /var/lib/isolatord although a container was held")
	}
	if !strings.Contains(msg, "containers are still held") {
		t.Errorf("purge with a container held did not say so: %q", msg)
	}
	// Purge with none held: the state goes.
	if err := os.Remove("/var/lib/isolatord/held-at-remove"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("/var/lib/isolatord/isolatord.db", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, root, env, "dpkg", "-i", deb)
	run(t, root, env, "dpkg", "--purge", "isolatord")
	for _, p := range []string{"/var/lib/isolatord", "/etc/isolatord", "/etc/default/isolatord", "/usr/sbin/isolatord",
		"/usr/lib/cni/isolator-cni", "/lib/systemd/system/isolatord.service",
		"/etc/systemd/system/sockets.target.wants/isolatord.socket"} {
		if exists(p) {
			t.Errorf("%s left after purge", p)
		}
	}
	if !optLinkBefore && exists("/opt/cni/bin/isolator-cni") {
		t.Error("/opt/cni/bin/isolator-cni left after purge")
	}
	if !optBefore && exists("/opt/cni/bin") {
		t.Error("/opt/cni/bin created by the package and left after purge")
	}
}

// checkNoMountNamespace fails when the unit sets an option that gives the
// service a mount namespace of its own.
func checkNoMountNamespace(t *testing.T, unit string) {
	t.Helper()
	b, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), "=")
		if !ok || strings.HasPrefix(k, "#") {
			continue
		}
		allowed, listed := mountNamespaceOptions[strings.TrimPrefix(k, "-")]
		if !listed {
			continue
		}
		v = strings.TrimSpace(v)
		okValue := v == ""
		for _, a := range allowed {
			okValue = okValue || v == a
		}
		if !okValue {
			t.Errorf("%s sets %s=%s: the service would get a mount namespace of its own and `ip netns` would not see its pins", filepath.Base(unit), k, v)
		}
	}
	for _, want := range []string{"CapabilityBoundingSet=", "NoNewPrivileges=yes", "RestrictAddressFamilies=", "SystemCallFilter=", "UMask=0077"} {
		if !bytes.Contains(b, []byte("\n"+want)) {
			t.Errorf("%s lacks %s", filepath.Base(unit), want)
		}
	}
}

var exposureRE = regexp.MustCompile(`Overall exposure level for isolatord\.service: ([0-9.]+)`)

// exposure is systemd-analyze security's exposure score of the unit.
func exposure(t *testing.T, unit string) float64 {
	t.Helper()
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze not installed (package systemd)")
	}
	b, _ := exec.Command("systemd-analyze", "security", "--offline=true", "--no-pager", unit).CombinedOutput()
	m := exposureRE.FindSubmatch(b)
	if m == nil {
		t.Fatalf("systemd-analyze security printed no exposure:\n%s", b)
	}
	e, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: exposure %.1f", unit, e)
	return e
}

// verifyUnits runs systemd-analyze verify on the installed units: nothing
// about ours may be reported (units the machine lacks, named in Before=,
// are fine).
func verifyUnits(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Log("systemd-analyze not installed: units not verified")
		return
	}
	b, err := exec.Command("systemd-analyze", "verify", "/lib/systemd/system/isolatord.socket", "/lib/systemd/system/isolatord.service").CombinedOutput()
	bad := false
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "isolatord") {
			t.Errorf("systemd-analyze verify: %s", l)
			bad = true
		}
	}
	if err != nil && bad {
		t.Errorf("systemd-analyze verify: %v", err)
	}
}

// noDaemon fails when an installed isolatord runs.
func noDaemon(t *testing.T) {
	t.Helper()
	ds, _ := os.ReadDir("/proc")
	for _, d := range ds {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		if exe, err := os.Readlink("/proc/" + d.Name() + "/exe"); err == nil && strings.HasPrefix(exe, "/usr/sbin/isolatord") {
			t.Errorf("installing started isolatord (pid %s)", d.Name())
		}
	}
	if exists("/run/isolatord/isolatord.sock") && !exists("/run/systemd/system") {
		t.Log("/run/isolatord/isolatord.sock exists (another isolatord on this machine?); the test does not connect to it")
	}
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return !errors.Is(err, fs.ErrNotExist)
}

// run runs a command in dir with env added, failing the test on error; it
// returns the combined output.
func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, b)
	}
	return string(b)
}
