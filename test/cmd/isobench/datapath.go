package main

// The data-path phase: echo checks and throughput/latency measured
// against each target from the client namespace.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/isolatord/isolatord/test/traffic"
)

// echo checks that t's server answers with its name.
func echo(ctx context.Context, t *target) error {
	var reply string
	err := t.client.Do(func() (err error) {
		reply, err = traffic.Echo(ctx, "tcp", t.addr, "bench", traffic.WithTimeout(3*time.Second))
		return err
	})
	if err != nil {
		return fmt.Errorf("%s from %s: %w", t.addr, t.client.Name, err)
	}
	if got := traffic.ReplyName(reply); got != t.name {
		return fmt.Errorf("%s from %s answered by %q, want %q: traffic does not reach the server it should", t.addr, t.client.Name, got, t.name)
	}
	return nil
}

// measure runs one data-plane measurement from t's client namespace.
func (b *bench) measure(ctx context.Context, metric string, t *target, dur time.Duration) (float64, error) {
	var v float64
	err := t.client.Do(func() (err error) {
		switch metric {
		case metricRR:
			v, err = traffic.RequestResponse(ctx, "tcp", t.addr, dur)
		case metricCRR:
			v, err = traffic.ConnectRate(ctx, t.addr, dur)
		case metricBulk:
			v, err = traffic.Bulk(ctx, t.addr, dur)
		case metricFragRR:
			v, err = traffic.FragRequestResponse(ctx, t.addr, fragRequest, dur)
		default:
			err = fmt.Errorf("unknown metric %q", metric)
		}
		return err
	})
	return v, err
}

// phaseData measures every available case over each family, o.rounds
// times, rotating the order of the cases each round.
func (b *bench) phaseData(ctx context.Context) error {
	type famCase struct {
		f family
		c string
	}
	var avail []famCase
	for _, f := range families {
		for _, c := range cases {
			t := b.targetsOf(f)[c]
			if t == nil {
				b.fail("data plane case (%s) over %s: no server (see the errors above)", c, f.label())
				continue
			}
			if err := echo(ctx, t); err != nil {
				b.fail("data plane case (%s) over %s: %v", c, f.label(), err)
				continue
			}
			// Warm up the path (neighbour entries, caches).
			if _, err := b.measure(ctx, metricRR, t, 50*time.Millisecond); err != nil {
				b.fail("data plane case (%s) over %s: warm-up: %v", c, f.label(), err)
				continue
			}
			avail = append(avail, famCase{f, c})
		}
	}
	if len(avail) == 0 {
		return errors.New("no server reachable")
	}
	cpu0 := map[string]float64{}
	daemons := map[string]*daemon{"s1": b.d1, "sn": b.dN}
	for k, d := range daemons {
		if d != nil {
			if v, err := cpuSeconds(d); err == nil {
				cpu0[k] = v
			}
		}
	}
	defer func() {
		for k, d := range daemons {
			if v0, ok := cpu0[k]; ok && d != nil {
				if v, err := cpuSeconds(d); err == nil {
					b.res.DataPlane.DaemonCPUSeconds[k] = ptr(v - v0)
				}
			}
		}
	}()
	failed := map[string]bool{}
	for r := 0; r < b.o.rounds; r++ {
		for _, m := range metrics {
			for k := range avail {
				fc := avail[(k+r)%len(avail)]
				key := m + "/" + fc.c + "/" + string(fc.f)
				if failed[key] {
					continue
				}
				if ctx.Err() != nil {
					return ctx.Err()
				}
				v, err := b.measure(ctx, m, b.targetsOf(fc.f)[fc.c], b.o.dur)
				if err != nil {
					failed[key] = true
					b.fail("data plane %s case (%s) over %s: %v", m, fc.c, fc.f.label(), err)
					continue
				}
				rate := b.res.dataPlane(fc.f).Rates[m][fc.c]
				rate.Samples = append(rate.Samples, v)
			}
		}
		b.logf("data plane round %d/%d done", r+1, b.o.rounds)
	}
	for _, f := range families {
		for _, m := range metrics {
			for _, c := range cases {
				rate := b.res.dataPlane(f).Rates[m][c]
				if !failed[m+"/"+c+"/"+string(f)] {
					rate.Median = median(rate.Samples)
				}
			}
		}
	}
	return nil
}
