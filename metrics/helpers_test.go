package metrics

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// families is one parsed scrape.
type families map[string]*dto.MetricFamily

// scrape GETs h's /metrics in the text exposition format and parses it with
// the Prometheus text parser.
func scrape(t testing.TB, h http.Handler) families {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: HTTP %d: %s", rec.Code, rec.Body.String())
	}
	return parse(t, rec.Body)
}

func parse(t testing.TB, r io.Reader) families {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		t.Fatalf("parse exposition: %v", err)
	}
	return fams
}

// find returns the metric of family name whose labels are exactly labels
// (pairs "k", "v", ...), or nil.
func (f families) find(name string, labels ...string) *dto.Metric {
	fam := f[name]
	if fam == nil {
		return nil
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	for _, m := range fam.GetMetric() {
		if len(m.GetLabel()) != len(want) {
			continue
		}
		ok := true
		for _, lp := range m.GetLabel() {
			if v, has := want[lp.GetName()]; !has || v != lp.GetValue() {
				ok = false
				break
			}
		}
		if ok {
			return m
		}
	}
	return nil
}

// value returns the value of a counter, gauge or untyped series, failing the
// test if it does not exist.
func (f families) value(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	m := f.find(name, labels...)
	if m == nil {
		t.Fatalf("series %s%s not found; family has:\n%s", name, fmtLabels(labels), f.dump(name))
	}
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	t.Fatalf("series %s%s is not a counter or gauge", name, fmtLabels(labels))
	return 0
}

// histogram returns a histogram series, failing the test if it does not exist.
func (f families) histogram(t testing.TB, name string, labels ...string) *dto.Histogram {
	t.Helper()
	m := f.find(name, labels...)
	if m == nil || m.Histogram == nil {
		t.Fatalf("histogram %s%s not found; family has:\n%s", name, fmtLabels(labels), f.dump(name))
	}
	return m.Histogram
}

// nonZero lists the series of a family whose value is not 0.
func (f families) nonZero(name string) []string {
	var out []string
	for _, m := range f[name].GetMetric() {
		v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
		if v != 0 {
			out = append(out, labelString(m))
		}
	}
	sort.Strings(out)
	return out
}

func (f families) dump(name string) string {
	var b strings.Builder
	for _, m := range f[name].GetMetric() {
		b.WriteString("  " + labelString(m) + "\n")
	}
	return b.String()
}

func labelString(m *dto.Metric) string {
	var parts []string
	for _, lp := range m.GetLabel() {
		parts = append(parts, lp.GetName()+"="+lp.GetValue())
	}
	return "{" + strings.Join(parts, ",") + "}"
}

func fmtLabels(labels []string) string {
	var parts []string
	for i := 0; i+1 < len(labels); i += 2 {
		parts = append(parts, labels[i]+"="+labels[i+1])
	}
	return "{" + strings.Join(parts, ",") + "}"
}
