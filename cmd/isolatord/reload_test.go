package main

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadConfigFile(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name, text, fault string
		vals              map[string]string
		fixed             []string
	}{
		{name: "ok", text: "# c\n\n log-level = debug \nallow-uid=0,1000\negress-rate-limit=2MB/s\nports=31000-31999\n",
			vals: map[string]string{"log-level": "debug", "allow-uid": "0,1000", "egress-rate-limit": "2MB/s"}, fixed: []string{"ports"}},
		{name: "no equals", text: "log-level debug\n", fault: `line 1: "log-level debug" is not key=value`},
		{name: "unknown", text: "\nloglevel=debug\n", fault: `line 2: "loglevel" is no isolatord setting`},
		{name: "twice", text: "log-level=debug\nlog-level=info\n", fault: "line 2: log-level set twice"},
	} {
		p := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "_"))
		if err := os.WriteFile(p, []byte(c.text), 0o600); err != nil {
			t.Fatal(err)
		}
		vals, fixed, err := readConfigFile(p, isFlag)
		if c.fault != "" {
			if err == nil || err.Error() != c.fault {
				t.Errorf("%s: err %v, want %q", c.name, err, c.fault)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(vals) != len(c.vals) || strings.Join(fixed, ",") != strings.Join(c.fixed, ",") {
			t.Errorf("%s: %v %v, want %v %v", c.name, vals, fixed, c.vals, c.fixed)
		}
		for k, v := range c.vals {
			if vals[k] != v {
				t.Errorf("%s: %s=%q, want %q", c.name, k, vals[k], v)
			}
		}
	}
	if _, _, err := readConfigFile(filepath.Join(dir, "missing"), isFlag); err == nil {
		t.Error("a missing file read without error")
	}
}

// TestConfigFileOverFlags: the file's values win over the flags at
// start-up, the flags stay the defaults of keys the file leaves out, and a
// bad value in the file stops the start.
func TestConfigFileOverFlags(t *testing.T) {
	p := filepath.Join(t.TempDir(), "conf")
	if err := os.WriteFile(p, []byte("log-level=warn\negress-rate-limit=2MB/s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := parseFlags([]string{"--config", p, "--log-level", "debug", "--allow-uid", "0,7", "--ingress-rate-limit", "1MB/s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c, _, err := applyConfigFile(o)
	if err != nil {
		t.Fatal(err)
	}
	live, err := c.live()
	if err != nil {
		t.Fatal(err)
	}
	if live.level != slog.LevelWarn || live.egress.Rate != 2_000_000 || live.ingress.Rate != 1_000_000 || len(live.uids) != 2 {
		t.Errorf("settings %+v", live)
	}
	if o.logLevel != "debug" {
		t.Errorf("the flags changed: %+v", o)
	}
	if err := os.WriteFile(p, []byte("egress-rate-limit=fast\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := applyConfigFile(o); err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "egress-rate-limit") {
		t.Errorf("bad value: %v", err)
	}
}

// TestReloadLogsWhatChanged: a reload logs each change, reports what it
// cannot change, and a bad file changes nothing (one line).
func TestReloadLogsWhatChanged(t *testing.T) {
	p := filepath.Join(t.TempDir(), "conf")
	write := func(s string) {
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	flags, err := parseFlags([]string{"--config", p, "--allow-uid", "0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	live, err := flags.live()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	level := new(slog.LevelVar)
	r := &reloader{flags: flags, log: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: level})), level: level, uids: newUIDSet(live.uids), cur: live}

	write("log-level=error\nallow-uid=0,1000\nstate-dir=/elsewhere\n")
	r.reload()
	for _, want := range []string{
		`"msg":"reload: setting changed","setting":"log-level","from":"INFO","to":"ERROR"`,
		`"msg":"reload: setting changed","setting":"allow-uid","from":"0","to":"0,1000"`,
		`"msg":"config file: setting ignored; it does not change at run time: use the flag and restart","file":"` + p + `","setting":"state-dir"`,
		`"msg":"reloaded","file":"` + p + `","changed":2,"not_changed":1`,
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("no %s in:\n%s", want, buf.String())
		}
	}
	if level.Level() != slog.LevelError || !r.uids.allows(1000) {
		t.Errorf("level %v, uid 1000 allowed %v", level.Level(), r.uids.allows(1000))
	}

	buf.Reset()
	write("log-level=debug\nallow-uid=x\n")
	r.reload()
	if n := strings.Count(buf.String(), "\n"); n != 1 || !strings.Contains(buf.String(), `"msg":"reload: config file refused; nothing changed","file":"`+p+`"`) || !strings.Contains(buf.String(), `\"x\" is not a uid`) {
		t.Errorf("bad file: %d lines:\n%s", n, buf.String())
	}
	if level.Level() != slog.LevelError || !r.uids.allows(1000) {
		t.Errorf("a bad file changed the settings: level %v, uid 1000 allowed %v", level.Level(), r.uids.allows(1000))
	}
	t.Log(buf.String())
}
