package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"strings"
)

// CNI bridge+portmap figures the issue compares against (ms per ADD / DEL
// on this kind of machine).
const (
	peerCNIAddMs = 93
	peerCNIDelMs = 230
)

// evaluate adds the control phase's targets.
func (c *ControlScale) evaluate(n int, add func(name string, v *float64, unit string, atMost bool, goal float64)) {
	if c == nil {
		return
	}
	p50 := func(l *Latency) *float64 { return latP(l, false) }
	p99 := func(l *Latency) *float64 { return latP(l, true) }
	add("process-held: setup p50, N=1", p50(c.SetupN1), "ms", true, 3)
	add(fmt.Sprintf("process-held: setup p50, N=%d", n), p50(c.SetupNN), "ms", true, 3)
	add(fmt.Sprintf("process-held: setup p50 N=%d / N=1", n), c.SetupRatio, "x", true, 1.3)
	add("process-held: teardown p50, N=1", p50(c.TeardownN1), "ms", true, 3)
	add(fmt.Sprintf("process-held: teardown p50, N=%d", n), p50(c.TeardownNN), "ms", true, 3)
	add(fmt.Sprintf("process-held: %d set up one by one", n), c.SetupAllSeconds, "s", true, 3)
	add(fmt.Sprintf("burst: %d setups at once", c.BurstSize), c.BurstSetupSeconds, "s", true, 1)
	add(fmt.Sprintf("burst: %d teardowns at once", c.BurstSize), c.BurstTeardownSeconds, "s", true, 1)
	add(fmt.Sprintf("drain: %d teardowns at once", n), c.DrainSeconds, "s", true, 2)
	add("Usage/Get p99 during bursts", p99(c.ReadsDuringBursts), "ms", true, 5)
	add("CNI ADD p50", p50(c.CNIAdd), "ms", true, 10)
	add("CNI DEL p50", p50(c.CNIDel), "ms", true, 5)
}

// writeMarkdown prints the control phase's table.
func (c *ControlScale) writeMarkdown(w io.Writer, r *Results) {
	if c == nil {
		return
	}
	n := r.Config.Containers
	nn := groupThousands(fmt.Sprint(n))
	settled := ""
	if c.SettleSeconds != nil {
		if c.Settled {
			settled = fmt.Sprintf("; started %.1f s after the earlier phases, once the kernel was done with them", *c.SettleSeconds)
		} else {
			settled = fmt.Sprintf("; started after %.0f s without the machine becoming quiet", *c.SettleSeconds)
		}
	}
	fmt.Fprintf(w, "\n**Control plane, namespaces held by processes** (gRPC API, isolated by pid; p50 / p99 of %d samples per point%s)\n\n", r.Config.Cycles, settled)
	fmt.Fprintln(w, "| Figure | Value | Target | |")
	fmt.Fprintln(w, "|---|---|---|---|")
	row := func(fig, val, goal, name string) {
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", fig, val, goal, statusCell(r.targetStatus(name)))
	}
	secs := func(v *float64) string {
		if v == nil {
			return "n/a"
		}
		return fmt.Sprintf("%.3f s", *v)
	}
	row("Setup, N=1", fmtMs(c.SetupN1), "p50 <= 3 ms", "process-held: setup p50, N=1")
	row("Setup, "+nn+" present", fmtMs(c.SetupNN), "p50 <= 3 ms", fmt.Sprintf("process-held: setup p50, N=%d", n))
	row("Setup p50, "+nn+" / 1", fmtOpt(c.SetupRatio, "x"), "<= 1.3x", fmt.Sprintf("process-held: setup p50 N=%d / N=1", n))
	row("Teardown, N=1", fmtMs(c.TeardownN1), "p50 <= 3 ms", "process-held: teardown p50, N=1")
	row("Teardown, "+nn+" present", fmtMs(c.TeardownNN), "p50 <= 3 ms", fmt.Sprintf("process-held: teardown p50, N=%d", n))
	row("Set up "+nn+" one by one", secs(c.SetupAllSeconds), "<= 3 s", fmt.Sprintf("process-held: %d set up one by one", n))
	row(fmt.Sprintf("%d setups at once", c.BurstSize), secs(c.BurstSetupSeconds), "<= 1 s", fmt.Sprintf("burst: %d setups at once", c.BurstSize))
	row(fmt.Sprintf("%d teardowns at once", c.BurstSize), secs(c.BurstTeardownSeconds), "<= 1 s", fmt.Sprintf("burst: %d teardowns at once", c.BurstSize))
	row(nn+" teardowns at once (drain)", secs(c.DrainSeconds), "<= 2 s", fmt.Sprintf("drain: %d teardowns at once", n))
	if c.DrainDeletedSeconds != nil {
		fmt.Fprintf(w, "| Drained links deleted by the kernel (background, after the last answer) | %s | | |\n", secs(c.DrainDeletedSeconds))
	}
	row("Usage/Get during the bursts (on the burst's connection)", fmtMs(c.ReadsDuringBursts), "p99 <= 5 ms", "Usage/Get p99 during bursts")
	if c.ReadsSeparate != nil {
		fmt.Fprintf(w, "| Usage/Get during the bursts, by a process of its own (Usage %s, Get %s) | %s | | |\n", fmtMs(c.UsageSeparate), fmtMs(c.GetSeparate), fmtMs(c.ReadsSeparate))
	}
	row(fmt.Sprintf("CNI ADD, %s present (libcni exec; bridge+portmap: %d ms)", groupThousands(fmt.Sprint(c.CNIPresent)), peerCNIAddMs), fmtMs(c.CNIAdd), "p50 <= 10 ms", "CNI ADD p50")
	row(fmt.Sprintf("CNI DEL, %s present (libcni exec; bridge+portmap: %d ms)", groupThousands(fmt.Sprint(c.CNIPresent)), peerCNIDelMs), fmtMs(c.CNIDel), "p50 <= 5 ms", "CNI DEL p50")
	if c.CNIExec != nil {
		fmt.Fprintf(w, "\nCNI breakdown: %s.\n", c.cniBreakdown())
	}
	c.writeCNIBefore(w)
	if len(c.Curve) > 0 {
		fmt.Fprint(w, "\n| Present | Setup p50 / p99 | Teardown p50 / p99 |\n|---|---|---|\n")
		for _, p := range c.curveSorted() {
			fmt.Fprintf(w, "| %d | %s | %s |\n", p.Present, fmtMs(p.Setup), fmtMs(p.Teardown))
		}
	}
}

// writeSVG draws setup and teardown p50 and p99 against the number of
// containers present (log scale) as a plain SVG file.
func (c *ControlScale) writeSVG(path string) error {
	pts := c.curveSorted()
	if len(pts) == 0 {
		return nil
	}
	const (
		w, h           = 720, 420
		left, right    = 70, 170
		top, bottom    = 40, 60
		plotW, plotH   = w - left - right, h - top - bottom
		xMinLog, ticks = 0.0, 5
	)
	xMax := math.Log10(float64(pts[len(pts)-1].Present) + 1)
	if xMax <= 0 {
		xMax = 1
	}
	yMax := 1.0
	for _, p := range pts {
		for _, l := range []*Latency{p.Setup, p.Teardown} {
			if l != nil && l.P99Ms > yMax {
				yMax = l.P99Ms
			}
		}
	}
	yMax = niceCeil(yMax)
	x := func(present int) float64 {
		return left + (math.Log10(float64(present)+1)-xMinLog)/(xMax-xMinLog)*plotW
	}
	y := func(ms float64) float64 { return top + plotH - ms/yMax*plotH }
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&sb, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&sb, `<text x="%d" y="22" font-size="15">Setup and teardown latency against containers present (gRPC API, namespaces held by processes)</text>`+"\n", left-40)
	fmt.Fprintf(&sb, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, top+plotH, left+plotW, top+plotH)
	fmt.Fprintf(&sb, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, top, left, top+plotH)
	for i := 0; i <= ticks; i++ {
		v := yMax * float64(i) / ticks
		fmt.Fprintf(&sb, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n",
			left, y(v), left+plotW, y(v), left-6, y(v)+4, fmtNum(v))
	}
	for _, p := range pts {
		fmt.Fprintf(&sb, `<text x="%.1f" y="%d" text-anchor="middle">%d</text>`+"\n", x(p.Present), top+plotH+18, p.Present)
	}
	fmt.Fprintf(&sb, `<text x="%d" y="%d" text-anchor="middle">containers present (log scale)</text>`+"\n", left+plotW/2, h-18)
	fmt.Fprintf(&sb, `<text x="18" y="%d" transform="rotate(-90 18 %d)" text-anchor="middle">milliseconds</text>`+"\n", top+plotH/2, top+plotH/2)
	series := []struct {
		name, color, dash string
		get               func(CurvePoint) *float64
	}{
		{"setup p50", "#1f77b4", "", func(p CurvePoint) *float64 { return latP(p.Setup, false) }},
		{"setup p99", "#1f77b4", "5,4", func(p CurvePoint) *float64 { return latP(p.Setup, true) }},
		{"teardown p50", "#d62728", "", func(p CurvePoint) *float64 { return latP(p.Teardown, false) }},
		{"teardown p99", "#d62728", "5,4", func(p CurvePoint) *float64 { return latP(p.Teardown, true) }},
	}
	for i, s := range series {
		var coords []string
		for _, p := range pts {
			if v := s.get(p); v != nil {
				coords = append(coords, fmt.Sprintf("%.1f,%.1f", x(p.Present), y(*v)))
			}
		}
		dash := ""
		if s.dash != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, s.dash)
		}
		fmt.Fprintf(&sb, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", s.color, dash, strings.Join(coords, " "))
		for _, c := range coords {
			xy := strings.Split(c, ",")
			fmt.Fprintf(&sb, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", xy[0], xy[1], s.color)
		}
		ly := top + 20 + i*22
		fmt.Fprintf(&sb, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/><text x="%d" y="%d">%s</text>`+"\n",
			left+plotW+15, ly, left+plotW+45, ly, s.color, dash, left+plotW+52, ly+4, s.name)
	}
	sb.WriteString("</svg>\n")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(sb.String()), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func latP(l *Latency, p99 bool) *float64 {
	if l == nil {
		return nil
	}
	if p99 {
		return ptr(l.P99Ms)
	}
	return ptr(l.P50Ms)
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*e {
			return m * e
		}
	}
	return 10 * e
}
