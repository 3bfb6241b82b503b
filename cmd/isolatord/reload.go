package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator"
	"github.com/isolatord/isolatord/isolator/plane/rate"
)

// The settings that change at run time: the --config file (key=value
// lines, '#' comments) sets them over their flags, which stay the
// defaults; SIGHUP reads the file again. Keys are the flags' names.
const (
	keyLogLevel = "log-level"
	keyAllowUID = "allow-uid"
	// keyHostLoopbackPorts: host loopback ports open to every container
	keyHostLoopbackPorts = "host-loopback-ports"
)

// reloadable are the keys the file may set, in the order changes are
// logged; any other flag's name is reported as not changeable at run time.
var reloadable = []string{keyLogLevel, keyAllowUID, keyHostLoopbackPorts,
	"egress-rate-limit", "egress-burst", "egress-ceil",
	"ingress-rate-limit", "ingress-burst", "ingress-ceil"}

// liveSettings are the values of the settings that change at run time.
type liveSettings struct {
	level           slog.Level
	uids            []uint32
	egress, ingress rate.Limit
	loopback        ephemeral.Set // host loopback ports open to every container
}

// readConfigFile parses a --config file: key=value lines; blank lines and
// lines starting with '#' are skipped. A key must be a flag's name and
// appear once. It returns the reloadable keys' values and the other flags'
// names the file sets (not changeable at run time).
func readConfigFile(path string, known func(string) bool) (map[string]string, []string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	vals := map[string]string{}
	var fixed []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch {
		case !ok || k == "":
			return nil, nil, fmt.Errorf("line %d: %q is not key=value", n, line)
		case !known(k):
			return nil, nil, fmt.Errorf("line %d: %q is no isolatord setting", n, k)
		case !slices.Contains(reloadable, k):
			fixed = append(fixed, k)
			continue
		}
		if _, dup := vals[k]; dup {
			return nil, nil, fmt.Errorf("line %d: %s set twice", n, k)
		}
		vals[k] = v
	}
	return vals, fixed, sc.Err()
}

// withFile is o with the file's values over its flags'.
func withFile(o *options, vals map[string]string) *options {
	c := *o
	for k, v := range vals {
		*c.reloadableField(k) = v
	}
	return &c
}

// reloadableField is the field of o that holds the reloadable key k.
func (o *options) reloadableField(k string) *string {
	switch k {
	case keyLogLevel:
		return &o.logLevel
	case keyAllowUID:
		return &o.allowUIDs
	case "egress-rate-limit":
		return &o.egressRate
	case "egress-burst":
		return &o.egressBurst
	case "egress-ceil":
		return &o.egressCeil
	case "ingress-rate-limit":
		return &o.ingressRate
	case "ingress-burst":
		return &o.ingressBurst
	case "ingress-ceil":
		return &o.ingressCeil
	case keyHostLoopbackPorts:
		return &o.hostLoopbackPorts
	}
	panic("not a reloadable key: " + k)
}

// live parses the settings that change at run time from o.
func (o *options) live() (liveSettings, error) {
	var s liveSettings
	var err error
	if err = s.level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return s, fmt.Errorf("--%s: %v", keyLogLevel, err)
	}
	if s.uids, err = parseUIDs(o.allowUIDs); err != nil {
		return s, err
	}
	if s.egress, err = limitFlags("egress", o.egressRate, o.egressBurst, o.egressCeil); err != nil {
		return s, err
	}
	if s.ingress, err = limitFlags("ingress", o.ingressRate, o.ingressBurst, o.ingressCeil); err != nil {
		return s, err
	}
	if s.loopback, err = ephemeral.ParseSet(o.hostLoopbackPorts); err != nil {
		return s, fmt.Errorf("--%s: %w", keyHostLoopbackPorts, err)
	}
	return s, nil
}

// applyConfigFile puts the --config file's values over the flags at
// start-up; a fault in the file is an error, like a bad flag. It returns
// the other flags' names the file sets (ignored: see logFixed).
func applyConfigFile(o *options) (*options, []string, error) {
	if o.config == "" {
		return o, nil, nil
	}
	vals, fixed, err := readConfigFile(o.config, isFlag)
	if err != nil {
		return nil, nil, fmt.Errorf("--config %s: %w", o.config, err)
	}
	c := withFile(o, vals)
	if _, err := c.live(); err != nil {
		return nil, nil, fmt.Errorf("--config %s: %w", o.config, err)
	}
	return c, fixed, nil
}

// logFixed reports a setting of the --config file that does not change at
// run time: ignored, its flag's value kept.
func logFixed(log *slog.Logger, file, key string) {
	log.Warn("config file: setting ignored; it does not change at run time: use the flag and restart", "file", file, "setting", key, "flag", "--"+key)
}

// isFlag reports whether name is one of isolatord's flags.
func isFlag(name string) bool {
	fs := flagSet(&options{}, io.Discard)
	return fs.Lookup(name) != nil
}

// uidSet is the set of uids allowed to call the API, replaced whole by a
// reload.
type uidSet struct{ p atomic.Pointer[[]uint32] }

func newUIDSet(uids []uint32) *uidSet {
	s := &uidSet{}
	s.set(uids)
	return s
}

func (s *uidSet) set(uids []uint32) { s.p.Store(&uids) }
func (s *uidSet) list() []uint32    { return *s.p.Load() }

func (s *uidSet) allows(uid uint32) bool { return slices.Contains(s.list(), uid) }

// reloader applies the --config file again on SIGHUP: what changed is
// logged setting by setting; a value the host cannot take (a default limit
// above the link speed, or without HTB) is logged with the reason and the
// old value kept; a file that cannot be read or parsed changes nothing
// (one log line naming the file and the fault).
type reloader struct {
	flags *options // the flags as given: the defaults of the file's keys
	log   *slog.Logger
	level *slog.LevelVar
	uids  *uidSet
	iso   *isolator.Isolator
	// newUIDs, when set, is told the uids a reload allows anew (metrics).
	newUIDs func([]uint32)
	// loopback opens the host loopback ports to every container (the data
	// plane's SetHostLoopbackPorts).
	loopback func(ephemeral.Set) error

	mu  sync.Mutex
	cur liveSettings
}

// reload reads the file again and applies it.
func (r *reloader) reload() {
	r.mu.Lock()
	defer r.mu.Unlock()
	path := r.flags.config
	vals, fixed, err := readConfigFile(path, isFlag)
	var next liveSettings
	if err == nil {
		next, err = withFile(r.flags, vals).live()
	}
	if err != nil {
		r.log.Error("reload: config file refused; nothing changed", "file", path, "fault", err.Error())
		return
	}
	changed, kept := 0, 0
	note := func(key, from, to string) {
		changed++
		r.log.Info("reload: setting changed", "setting", key, "from", from, "to", to)
	}
	refuse := func(key, wanted, old, reason string) {
		kept++
		r.log.Warn("reload: setting not changed; old value kept", "setting", key, "wanted", wanted, "kept", old, "reason", reason)
	}
	for _, k := range fixed {
		kept++
		logFixed(r.log, path, k)
	}
	if next.level != r.cur.level {
		note(keyLogLevel, r.cur.level.String(), next.level.String())
	}
	if !slices.Equal(next.uids, r.cur.uids) {
		note(keyAllowUID, uidsString(r.cur.uids), uidsString(next.uids))
		r.uids.set(next.uids)
		if r.newUIDs != nil {
			var fresh []uint32
			for _, u := range next.uids {
				if !slices.Contains(r.cur.uids, u) {
					fresh = append(fresh, u)
				}
			}
			r.newUIDs(fresh)
		}
		r.cur.uids = next.uids
	}
	for _, d := range []struct {
		name string
		cur  *rate.Limit
		next rate.Limit
		set  func(rate.Limit) error
	}{
		{"egress default limit (egress-rate-limit, egress-burst, egress-ceil)", &r.cur.egress, next.egress, r.iso.SetDefaultEgress},
		{"ingress default limit (ingress-rate-limit, ingress-burst, ingress-ceil)", &r.cur.ingress, next.ingress, r.iso.SetDefaultIngress},
	} {
		if d.next == *d.cur {
			continue
		}
		if err := d.set(d.next); err != nil {
			refuse(d.name, isolator.LimitString(d.next), isolator.LimitString(*d.cur), err.Error())
			continue
		}
		note(d.name, isolator.LimitString(*d.cur), isolator.LimitString(d.next))
		*d.cur = d.next
	}
	if next.loopback.String() != r.cur.loopback.String() {
		if err := r.loopback(next.loopback); err != nil {
			refuse(keyHostLoopbackPorts, next.loopback.String(), r.cur.loopback.String(), err.Error())
		} else {
			note(keyHostLoopbackPorts, r.cur.loopback.String(), next.loopback.String())
			r.cur.loopback = next.loopback
		}
	}
	r.log.Info("reloaded", "file", path, "changed", changed, "not_changed", kept)
	// last, so that a level made stricter does not hide the lines above
	r.level.Set(next.level)
	r.cur.level = next.level
}

// serve runs a reload for each request on reloads until ctx ends (SIGHUP
// requests one; those received before serving wait until then).
func (r *reloader) serve(ctx context.Context, reloads <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-reloads:
			r.reload()
		}
	}
}

func uidsString(uids []uint32) string {
	s := make([]string, len(uids))
	for i, u := range uids {
		s[i] = strconv.FormatUint(uint64(u), 10)
	}
	return strings.Join(s, ",")
}
