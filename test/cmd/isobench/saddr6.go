package main

// IPv6 source selection (dataplane/saddr6.go). In SN, after the data
// plane phase: the (d) server in SN's host namespace answers UDP from an
// unconnected socket, so the kernel chooses the source of every reply,
// weighing the addresses of every link with the isolator's narrowing
// (use_oif_addrs_only=1 on eth0, which isolatord sets) and without it (the
// benchmark writes 0, in SN's host namespace only, and puts 1 back), in
// interleaved rounds: fragmented UDP r/r as in the data plane table, and
// 100-byte UDP r/r.

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/isolatord/isolatord/test/traffic"
)

const saddr6Small = 100

// Saddr6 are the source-selection figures: per request size ("4000",
// "100") and setting ("narrowed", "all_links"), UDP round trips per second.
type Saddr6 struct {
	Rates  map[string]map[string]*Rate `json:"rates"`
	Ratios map[string]*float64         `json:"ratios"` // narrowed / all_links
}

// phaseSaddr6 measures the (d) IPv6 server with and without the narrowing.
func (b *bench) phaseSaddr6(ctx context.Context) (err error) {
	t := b.targetsOf(ipv6)[caseD]
	if b.sbN == nil || t == nil {
		return errors.New("no case (d) IPv6 server in SN")
	}
	knob := "net.ipv6.conf." + b.sbN.HostEth0 + ".use_oif_addrs_only"
	if v, err := b.sbN.Host.Sysctl(knob); err != nil || v != "1" {
		return fmt.Errorf("%s in SN's host namespace is %q (%v), want 1: isolatord did not narrow source selection", knob, v, err)
	}
	defer func() {
		if e := b.sbN.Host.SetSysctl(knob, "1"); e != nil {
			err = errors.Join(err, e)
		}
	}()
	s := &Saddr6{Rates: map[string]map[string]*Rate{}, Ratios: map[string]*float64{}}
	b.res.Saddr6 = s
	sizes := []int{fragRequest, saddr6Small}
	for _, n := range sizes {
		s.Rates[fmt.Sprint(n)] = map[string]*Rate{"narrowed": {Samples: []float64{}}, "all_links": {Samples: []float64{}}}
	}
	settings := []string{"narrowed", "all_links"}
	for r := 0; r < b.o.rounds; r++ {
		for k := range settings {
			set := settings[(k+r)%2]
			v := "1"
			if set == "all_links" {
				v = "0"
			}
			if err := b.sbN.Host.SetSysctl(knob, v); err != nil {
				return err
			}
			for _, n := range sizes {
				var rate float64
				err := t.client.Do(func() (err error) {
					rate, err = traffic.FragRequestResponse(ctx, t.addr, n, b.o.dur)
					return err
				})
				if err != nil {
					return fmt.Errorf("%d-byte UDP r/r, %s: %w", n, set, err)
				}
				x := s.Rates[fmt.Sprint(n)][set]
				x.Samples = append(x.Samples, rate)
			}
		}
	}
	for _, n := range sizes {
		k := fmt.Sprint(n)
		for _, x := range s.Rates[k] {
			x.Median = median(x.Samples)
		}
		if a, o := s.Rates[k]["narrowed"].Median, s.Rates[k]["all_links"].Median; a != nil && o != nil && *o > 0 {
			s.Ratios[k] = ptr(*a / *o)
		}
	}
	return nil
}

func (s *Saddr6) writeMarkdown(w io.Writer, n string, rounds int, dur float64) {
	if s == nil {
		return
	}
	fmt.Fprintf(w, "\n**IPv6 source selection** (case (d) over IPv6, %s containers present: a host UDP server answering from an unconnected socket; eth0's addresses only, as isolatord sets it, against every link's; median of %d interleaved rounds of %gs)\n\n", n, rounds, dur)
	fmt.Fprintln(w, "| UDP r/r | eth0's addresses (use_oif_addrs_only=1) | every link's (0) | Ratio |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, k := range []string{fmt.Sprint(fragRequest), fmt.Sprint(saddr6Small)} {
		r := s.Rates[k]
		if r == nil {
			continue
		}
		ratio := "n/a"
		if v := s.Ratios[k]; v != nil {
			ratio = fmt.Sprintf("%.2f", *v)
		}
		fmt.Fprintf(w, "| %s B requests | %s | %s | %s |\n", k, fmtRate(metricFragRR, r["narrowed"].Median), fmtRate(metricFragRR, r["all_links"].Median), ratio)
	}
}
