package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestIPv6Rows: the IPv6 cases have ratios and targets of their own (named
// with " IPv6"), printed beside the IPv4 rows; results without IPv6 figures
// (older runs, read with --from) print the IPv4 tables alone.
func TestIPv6Rows(t *testing.T) {
	r := &Results{Config: Config{Containers: 1000}, DataPlane: newDataPlane(ipv4), DataPlane6: ptr(newDataPlane(ipv6))}
	r.DataPlane.Rates[metricRR][caseA].Median = ptr(100.0)
	r.DataPlane.Rates[metricRR][caseB].Median = ptr(96.0)
	r.DataPlane6.Rates[metricRR][caseA].Median = ptr(200.0)
	r.DataPlane6.Rates[metricRR][caseB].Median = ptr(100.0)
	r.DataPlane6.Rates[metricBulk][caseA].Median = ptr(1e9)
	r.DataPlane6.Rates[metricBulk][caseB].Median = ptr(1e9)
	r.computeRatios()
	r.evaluate()
	want := map[string]string{
		"request/response (b)/(a)":      "PASS",
		"request/response (b)/(a) IPv6": "MISS", // 0.5
		"bulk (b)/(a) IPv6":             "PASS",
		"bulk (b)/(a)":                  "NOT MEASURED",
		"new connections (d)/(a) IPv6":  "NOT MEASURED",
	}
	for name, st := range want {
		if got := r.targetStatus(name); got != st {
			t.Errorf("%s: %q, want %s", name, got, st)
		}
	}
	if n := len(r.Targets); n != 31 { // 9 of the control plane, 11 per family
		t.Errorf("%d targets, want 31", n)
	}
	var b bytes.Buffer
	r.Date = "2026-01-02T03:04:05Z"
	r.writeMarkdown(&b)
	md := b.String()
	for _, s := range []string{
		"each case over IPv4 and over IPv6",
		"| (b) container, 1 container, IPv4 | 96.0/s (0.96) |",
		"| (b) container, 1 container, IPv6 | 100/s (0.50) |",
		"| (b)/(a), IPv6 | 0.500 **MISS** |",
		"| (b)/(a), IPv4 | 0.960 PASS |",
	} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q:\n%s", s, md)
		}
	}
	if i, j := strings.Index(md, "| (a) host, no isolator state, IPv6 |"), strings.Index(md, "| (b) container, 1 container, IPv4 |"); i < 0 || j < i {
		t.Errorf("the IPv6 row of (a) is not beside its IPv4 row:\n%s", md)
	}

	// A run from before IPv6 was measured.
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if _, ok := doc["data_plane_ipv6"]; !ok {
		t.Fatal("JSON without data_plane_ipv6")
	}
	delete(doc, "data_plane_ipv6")
	var v4 []any
	for _, tg := range doc["targets"].([]any) {
		if !strings.HasSuffix(tg.(map[string]any)["name"].(string), " IPv6") {
			v4 = append(v4, tg)
		}
	}
	doc["targets"] = v4
	data, _ = json.Marshal(doc)
	var old Results
	if err := json.Unmarshal(data, &old); err != nil {
		t.Fatal(err)
	}
	b.Reset()
	old.writeMarkdown(&b)
	if md := b.String(); !strings.Contains(md, "| (b) container, 1 container | 96.0/s (0.96) |") || strings.Contains(md, "IPv6") {
		t.Errorf("results without IPv6 figures:\n%s", md)
	}
}
