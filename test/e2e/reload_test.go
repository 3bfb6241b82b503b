package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/test/sandbox"
)

// TestReloadOnSIGHUP: SIGHUP applies the --config file again. New
// containers get the new default limits (in the kernel too), containers
// already there keep theirs, the log level changes, and every change is
// logged; a bad file changes nothing and is named in one log line.
func TestReloadOnSIGHUP(t *testing.T) {
	sb := sandbox.New(t)
	conf := filepath.Join(t.TempDir(), "isolatord.conf")
	write := func(s string) {
		t.Helper()
		must(t, os.WriteFile(conf, []byte(s), 0o600))
	}
	// (the file's values win over the flags: the harness runs the daemon
	// with --log-level debug)
	write("# settings that change at run time\nlog-level = info\negress-rate-limit = 2MB/s\n")
	d := StartDaemon(t, sb, DaemonOptions{Extra: []string{"--config", conf}})

	type limit struct {
		Rate int64 `json:"rate"`
	}
	type limits struct {
		EgressLimit  *limit `json:"egress_limit"`
		IngressLimit *limit `json:"ingress_limit"`
	}
	rate := func(l *limit) int64 {
		if l == nil {
			return 0
		}
		return l.Rate
	}
	check := func(when, id string, egress, ingress int64) {
		t.Helper()
		var got limits
		d.CtlJSON(t, &got, "get", id)
		if rate(got.EgressLimit) != egress || rate(got.IngressLimit) != ingress {
			t.Fatalf("%s: %s has limits egress %d ingress %d, want egress %d ingress %d", when, id, rate(got.EgressLimit), rate(got.IngressLimit), egress, ingress)
		}
	}
	hup := func(want string) {
		t.Helper()
		before := len(d.Log())
		must(t, syscall.Kill(d.Pid(), syscall.SIGHUP))
		waitLog(t, d, want)
		if n := strings.Count(d.Log()[before:], want); n != 1 {
			t.Fatalf("%d lines %s after one SIGHUP, want 1:\n%s", n, want, d.Log()[before:])
		}
	}
	debugCalls := func() int { return strings.Count(d.Log(), `"level":"DEBUG","msg":"call"`) }

	a := sb.Name + "-ra"
	ca := startServer(t, sb, "ra", 31040)
	d.Ctl(t, "prepare", a, "--ports", "31040")
	d.Ctl(t, "isolate", a, "--pid", strconv.Itoa(ca.Pid))
	check("before the reload", a, 2_000_000, 0)
	if debugCalls() != 0 {
		t.Fatalf("debug lines at --log-level info:\n%s", d.Log())
	}

	write("log-level=debug\negress-rate-limit=4MB/s\ningress-rate-limit=1MB/s\n")
	hup(`"msg":"reloaded"`)
	for _, want := range []string{
		`"setting":"log-level","from":"INFO","to":"DEBUG"`,
		`"setting":"egress default limit (egress-rate-limit, egress-burst, egress-ceil)","from":"2MB/s","to":"4MB/s"`,
		`"setting":"ingress default limit (ingress-rate-limit, ingress-burst, ingress-ceil)","from":"none","to":"1MB/s"`,
		`"changed":3,"not_changed":0`,
	} {
		if !strings.Contains(d.Log(), want) {
			t.Fatalf("no %s in the log:\n%s", want, d.Log())
		}
	}

	b := sb.Name + "-rb"
	cb := startServer(t, sb, "rb", 31041)
	d.Ctl(t, "prepare", b, "--ports", "31041")
	d.Ctl(t, "isolate", b, "--pid", strconv.Itoa(cb.Pid))
	check("new container after the reload", b, 4_000_000, 1_000_000)
	check("old container after the reload", a, 2_000_000, 0)
	if out := sb.Host.Run(t, "tc", "qdisc", "show", "dev", plane.VethName(b)); !strings.Contains(out, "htb") {
		t.Fatalf("no ingress HTB on the new container's veth:\n%s", out)
	}
	if out := sb.Host.Run(t, "tc", "qdisc", "show", "dev", plane.VethName(a)); strings.Contains(out, "htb") {
		t.Fatalf("the old container's veth got an ingress HTB:\n%s", out)
	}
	mustEcho(t, sb, "tcp", 31040, "ra")
	mustEcho(t, sb, "tcp", 31041, "rb")
	calls := debugCalls()
	if calls == 0 {
		t.Fatalf("no debug lines after the reload to --log-level debug:\n%s", d.Log())
	}

	// A bad file: one line naming it and the fault; nothing changes.
	write("log-level=error\negress-rate-limit 8MB/s\n")
	hup(`"msg":"reload: config file refused; nothing changed","file":"` + conf + `"`)
	c := sb.Name + "-rc"
	d.Ctl(t, "prepare", c, "--ports", "31042")
	check("new container after a bad file", c, 4_000_000, 1_000_000)
	if debugCalls() <= calls {
		t.Fatalf("log level changed by a bad file: no debug lines since")
	}
	if strings.Contains(d.Log(), `"setting":"log-level","from":"DEBUG"`) {
		t.Fatalf("a bad file changed the log level:\n%s", d.Log())
	}
	d.Ctl(t, "cleanup", c)
	d.Ctl(t, "cleanup", b)
	d.Ctl(t, "cleanup", a)
}
