package isolator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/isolator/plane/rate"
)

func lim(r uint64) rate.Limit { return rate.Limit{Rate: r} }

func spec(rate int64) *LimitSpec { return &LimitSpec{Rate: rate} }

// newLimitIsolator is a started isolator with default limits and a host
// whose link speed is 1000 Mbit/s (125 MB/s).
func newLimitIsolator(t *testing.T, dir string, dp *fakeDP, egress, ingress rate.Limit) *Isolator {
	t.Helper()
	dp.Host.LinkSpeed = 1000
	dp.Host.Features = map[string]bool{plane.FeatureHTB: true}
	cfg := testConfig(t, dir)
	cfg.Egress, cfg.Ingress = egress, ingress
	s, err := New(cfg, dp)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestParseLimit(t *testing.T) {
	host := plane.HostInfo{Eth0: "eth0", LinkSpeed: 1000, Features: map[string]bool{plane.FeatureHTB: true}}
	good := []struct {
		s    LimitSpec
		want rate.Limit
	}{
		{LimitSpec{}, rate.Limit{}},
		{LimitSpec{Rate: 2_000_000}, lim(2_000_000)},
		{LimitSpec{Rate: 2_000_000, Burst: 100_000, Ceil: 4_000_000}, rate.Limit{Rate: 2_000_000, Burst: 100_000, Ceil: 4_000_000}},
		{LimitSpec{Rate: 125_000_000}, lim(125_000_000)}, // exactly the link speed
	}
	for _, c := range good {
		got, err := ParseLimit("egress_limit", c.s, host)
		if err != nil || got != c.want {
			t.Errorf("ParseLimit(%+v) = %+v, %v; want %+v", c.s, got, err, c.want)
		}
	}
	bad := []struct {
		s    LimitSpec
		code *Kind
		msg  []string
	}{
		{LimitSpec{Rate: -1}, ErrInvalidArgument, []string{"egress_limit.rate", "-1", "negative"}},
		{LimitSpec{Rate: 2_000_000, Burst: -5}, ErrInvalidArgument, []string{"egress_limit.burst", "negative"}},
		{LimitSpec{Rate: 2_000_000, Ceil: -5}, ErrInvalidArgument, []string{"egress_limit.ceil", "negative"}},
		{LimitSpec{Rate: 10}, ErrInvalidArgument, []string{"egress_limit.rate", "below the minimum"}},
		{LimitSpec{Burst: 100_000}, ErrInvalidArgument, []string{"egress_limit", "need a rate"}},
		{LimitSpec{Rate: 2_000_000, Ceil: 1_000_000}, ErrInvalidArgument, []string{"egress_limit.ceil", "below the rate"}},
		{LimitSpec{Rate: 2_000_000, Burst: 100}, ErrInvalidArgument, []string{"egress_limit.burst", "below the minimum"}},
		{LimitSpec{Rate: 125_000_001}, ErrInvalidArgument, []string{"egress_limit.rate", "above eth0's link speed of 1000 Mbit/s", "125MB/s"}},
		{LimitSpec{Rate: 2_000_000, Ceil: 200_000_000}, ErrInvalidArgument, []string{"egress_limit.ceil", "link speed"}},
		{LimitSpec{Rate: 1000, Burst: 100_000_000}, ErrInvalidArgument, []string{"egress_limit", "more than 60 s"}},
	}
	for _, c := range bad {
		_, err := ParseLimit("egress_limit", c.s, host)
		if err == nil {
			t.Errorf("ParseLimit(%+v) succeeded", c.s)
			continue
		}
		if KindOf(err) != c.code {
			t.Errorf("ParseLimit(%+v): %v (kind %v), want %v", c.s, err, KindOf(err), c.code)
		}
		for _, m := range c.msg {
			if !strings.Contains(err.Error(), m) {
				t.Errorf("ParseLimit(%+v): %q does not say %q", c.s, err, m)
			}
		}
	}
	// unknown link speed: not checked; no HTB: refused
	if _, err := ParseLimit("ingress_limit", LimitSpec{Rate: 10_000_000_000}, plane.HostInfo{}); err != nil {
		t.Errorf("unknown link speed: %v", err)
	}
	_, err := ParseLimit("ingress_limit", LimitSpec{Rate: 2_000_000}, plane.HostInfo{Features: map[string]bool{}})
	wantCode(t, err, ErrFailedPrecondition, "ingress_limit", "HTB")
}

func TestLimitsLifecycle(t *testing.T) {
	dir := t.TempDir()
	dp := newFakeDP()
	s := newLimitIsolator(t, dir, dp, lim(2_000_000), rate.Limit{})

	// defaults, overrides, explicit none
	r, err := s.Prepare(bg, "dflt", ports("31000"))
	if err != nil || r.Egress != lim(2_000_000) || !r.Ingress.IsZero() {
		t.Fatalf("default limits: %+v %v", r, err)
	}
	r, err = s.PrepareWith(bg, "own", PrepareOptions{Ports: ports("31001"), Egress: spec(0), Ingress: &LimitSpec{Rate: 3_000_000, Ceil: 6_000_000}})
	if err != nil || !r.Egress.IsZero() || r.Ingress != (rate.Limit{Rate: 3_000_000, Ceil: 6_000_000}) {
		t.Fatalf("own limits: %+v %v", r, err)
	}
	// repeated Prepare: same limits fine, other limits refused, none given fine
	if _, err := s.PrepareWith(bg, "own", PrepareOptions{Ports: ports("31001"), Egress: spec(0)}); err != nil {
		t.Errorf("repeat with the same limit: %v", err)
	}
	_, err = s.PrepareWith(bg, "own", PrepareOptions{Ports: ports("31001"), Egress: spec(5_000_000)})
	wantCode(t, err, ErrAlreadyExists, "egress limit none", "asked for 5MB/s")
	// refused limits leave nothing behind
	_, err = s.PrepareWith(bg, "bad", PrepareOptions{Egress: spec(-3)})
	wantCode(t, err, ErrInvalidArgument, "egress_limit.rate")
	if _, err := s.Get(bg, "bad"); KindOf(err) != ErrNotFound {
		t.Errorf("refused prepare left a record: %v", err)
	}

	// isolate passes the limits to the data plane
	if _, err := s.Isolate(bg, "dflt", nsTarget(t, "dflt")); err != nil {
		t.Fatal(err)
	}
	if got := dp.Limits["dflt"]; got != [2]rate.Limit{lim(2_000_000), {}} {
		t.Errorf("Setup got limits %v", got)
	}

	// limits-only update keeps the ports
	r, err = s.UpdateWith(bg, "dflt", UpdateOptions{KeepPorts: true, Egress: spec(4_000_000), Ingress: spec(1_000_000)})
	if err != nil || r.Ports.String() != "31000" || r.Egress != lim(4_000_000) || r.Ingress != lim(1_000_000) {
		t.Fatalf("limits update: %+v %v", r, err)
	}
	if got := dp.Limits["dflt"]; got != [2]rate.Limit{lim(4_000_000), lim(1_000_000)} {
		t.Errorf("SetLimits got %v", got)
	}
	// unchanged: no data plane call
	calls := len(dp.Calls())
	if _, err := s.UpdateWith(bg, "dflt", UpdateOptions{KeepPorts: true, Egress: spec(4_000_000)}); err != nil || len(dp.Calls()) != calls {
		t.Errorf("no-op update: %v, %d new calls", err, len(dp.Calls())-calls)
	}
	_, err = s.UpdateWith(bg, "dflt", UpdateOptions{KeepPorts: true, Ports: ports("31005")})
	wantCode(t, err, ErrInvalidArgument, "keep_ports")
	_, err = s.UpdateWith(bg, "dflt", UpdateOptions{KeepPorts: true, Ingress: spec(200_000_000)})
	wantCode(t, err, ErrInvalidArgument, "ingress_limit.rate", "link speed")

	// a data plane failure leaves the old limits (record and kernel)
	dp.FailNext["setlimits"] = errors.New("injected")
	_, err = s.UpdateWith(bg, "dflt", UpdateOptions{KeepPorts: true, Egress: spec(8_000_000)})
	wantCode(t, err, ErrInternal, "injected")
	if r, _ := s.Get(bg, "dflt"); r.Egress != lim(4_000_000) {
		t.Errorf("failed update changed the record: %+v", r.Egress)
	}
	// ports and limits together: a port failure puts the limits back
	dp.FailNext["setports"] = errors.New("injected ports")
	_, err = s.UpdateWith(bg, "dflt", UpdateOptions{Ports: ports("31002"), Egress: spec(8_000_000)})
	wantCode(t, err, ErrInternal, "injected ports")
	if r, _ := s.Get(bg, "dflt"); r.Egress != lim(4_000_000) || r.Ports.String() != "31000" {
		t.Errorf("failed port update: record %+v %s", r.Egress, r.Ports)
	}
	if got := dp.Limits["dflt"]; got[0] != lim(4_000_000) {
		t.Errorf("failed port update: data plane left at %v", got)
	}
	// both at once
	r, err = s.UpdateWith(bg, "dflt", UpdateOptions{Ports: ports("31002"), Egress: spec(0)})
	if err != nil || r.Ports.String() != "31002" || !r.Egress.IsZero() {
		t.Fatalf("ports and limits: %+v %v", r, err)
	}
	// prepared containers: only the record
	r, err = s.UpdateWith(bg, "own", UpdateOptions{KeepPorts: true, Egress: spec(7_000_000)})
	if err != nil || r.Egress != lim(7_000_000) || r.Ports.String() != "31001" {
		t.Fatalf("update of a prepared container: %+v %v", r, err)
	}
	if st := s.Status(bg); st.DefaultEgress != lim(2_000_000) || !st.DefaultIngress.IsZero() {
		t.Errorf("status defaults: %+v %+v", st.DefaultEgress, st.DefaultIngress)
	}

	// restart with other defaults: the containers keep their limits, and
	// Adopt gets them
	if _, err := s.UpdateWith(bg, "dflt", UpdateOptions{KeepPorts: true, Egress: spec(6_000_000)}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2 := newLimitIsolator(t, dir, dp, lim(9_000_000), lim(9_000_000))
	if r, _ := s2.Get(bg, "dflt"); r.Egress != lim(6_000_000) || r.Ingress != lim(1_000_000) {
		t.Errorf("after restart: %+v %+v", r.Egress, r.Ingress)
	}
	if got := dp.Limits["dflt"]; got != [2]rate.Limit{lim(6_000_000), lim(1_000_000)} {
		t.Errorf("Adopt got %v", got)
	}
	if r, _ := s2.Get(bg, "own"); r.Egress != lim(7_000_000) {
		t.Errorf("prepared container after restart: %+v", r.Egress)
	}
}

// A daemon killed between persisting new limits and the kernel change
// rolls them forward at recovery; a shaping failure at recovery keeps the
// container.
func TestLimitsRecovery(t *testing.T) {
	dir := t.TempDir()
	dp := newFakeDP()
	s := newLimitIsolator(t, dir, dp, rate.Limit{}, rate.Limit{})
	if _, err := s.PrepareWith(bg, "c1", PrepareOptions{Egress: spec(2_000_000)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Isolate(bg, "c1", nsTarget(t, "c1")); err != nil {
		t.Fatal(err)
	}
	s.SetHook(func(p string) {
		if p == "limits:intent" {
			panic(crash{p})
		}
	})
	func() {
		defer func() { recover() }()
		_, _ = s.UpdateWith(bg, "c1", UpdateOptions{KeepPorts: true, Egress: spec(3_000_000)})
	}()
	s.Close()
	if got := dp.Limits["c1"]; got[0] != lim(2_000_000) {
		t.Fatalf("the kernel changed before the crash: %v", got)
	}
	s2 := newLimitIsolator(t, dir, dp, rate.Limit{}, rate.Limit{})
	if got := dp.Limits["c1"]; got[0] != lim(3_000_000) {
		t.Errorf("recovery did not roll the limit forward: %v", got)
	}
	s2.Close()

	dp.FailNext["adopt"] = fmt.Errorf("%w: injected", plane.ErrShaping)
	s3 := newLimitIsolator(t, dir, dp, rate.Limit{}, rate.Limit{})
	if r, err := s3.Get(bg, "c1"); err != nil || r.State != StateIsolated {
		t.Errorf("a shaping failure at recovery dropped the container: %+v %v", r, err)
	}
}

func TestDefaultsAboveLinkSpeed(t *testing.T) {
	dp := newFakeDP()
	dp.Host.LinkSpeed = 100 // 12.5 MB/s
	cfg := testConfig(t, t.TempDir())
	cfg.Ingress = lim(20_000_000)
	s, err := New(cfg, dp)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.Start(bg)
	if err == nil || !strings.Contains(err.Error(), "default ingress limit.rate") || !strings.Contains(err.Error(), "link speed of 100 Mbit/s") {
		t.Errorf("Start with a default above the link speed: %v", err)
	}
}
