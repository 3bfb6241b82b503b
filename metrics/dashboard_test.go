package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator"
	"github.com/isolatord/isolatord/isolator/plane"
)

const dashboardPath = "../packaging/grafana-dashboard.json"

// Labels Prometheus adds at scrape time; the exposition never has them.
var targetLabels = map[string]bool{"job": true, "instance": true}

// allSeries gathers a registry in which every family has at least one series:
// a state source with an isolated container and per-container metrics on,
// and RPC series for one method.
func allSeries(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	m := New("test")
	m.InitRPCMethods([]string{"/isolatord.v1.Isolator/Prepare"}, "0")
	m.WatchState(&fakeSource{
		status: isolator.Status{Containers: map[isolator.State]int{}},
		recs:   []isolator.Record{{ID: "c1", State: isolator.StateIsolated, Ephemeral: ephemeral.Range{Begin: 32768, End: 33791}}},
		stats:  map[string]plane.LinkStats{"c1": {}},
	}, true)
	m.WatchRecovery(&fakeRecovery{})
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// family resolves a series name as PromQL sees it (histograms expose
// _bucket, _sum and _count; summaries _sum and _count) to its family.
func family(fams map[string]*dto.MetricFamily, name string) *dto.MetricFamily {
	if f := fams[name]; f != nil {
		return f
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suf); ok {
			if f := fams[base]; f != nil && (f.GetType() == dto.MetricType_HISTOGRAM || (suf != "_bucket" && f.GetType() == dto.MetricType_SUMMARY)) {
				return f
			}
		}
	}
	return nil
}

// hasLabel reports whether a series of f carries label (le for histogram
// buckets).
func hasLabel(f *dto.MetricFamily, label string) bool {
	if label == "le" && f.GetType() == dto.MetricType_HISTOGRAM {
		return true
	}
	for _, m := range f.GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == label {
				return true
			}
		}
	}
	return false
}

func hasLabelValue(f *dto.MetricFamily, label, value string) bool {
	for _, m := range f.GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == label && lp.GetValue() == value {
				return true
			}
		}
	}
	return false
}

var (
	reString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	reRange    = regexp.MustCompile(`\[[^\]]*\]`)
	reVar      = regexp.MustCompile(`\$\{?\w+\}?`)
	reGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	reSelector = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}`)
	reMatcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"`)
	reIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	reCall     = regexp.MustCompile(`^\s*\(`)
)

var promqlKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"bool": true, "and": true, "or": true, "unless": true, "offset": true, "atan2": true,
}

// exprMetrics returns the metric names an expression selects, the labels
// of its grouping clauses, and its label matchers per metric.
func exprMetrics(expr string) (metrics []string, grouping []string, matchers map[string][][3]string) {
	matchers = map[string][][3]string{}
	for _, sel := range reSelector.FindAllStringSubmatch(expr, -1) {
		for _, mm := range reMatcher.FindAllStringSubmatch(sel[2], -1) {
			matchers[sel[1]] = append(matchers[sel[1]], [3]string{mm[1], mm[2], mm[3]})
		}
	}
	s := reString.ReplaceAllString(expr, `""`)
	for _, g := range reGrouping.FindAllStringSubmatch(s, -1) {
		for _, l := range strings.Split(g[2], ",") {
			if l = strings.TrimSpace(l); l != "" {
				grouping = append(grouping, l)
			}
		}
	}
	s = reGrouping.ReplaceAllString(s, " ")
	s = reRange.ReplaceAllString(s, " ")
	s = reVar.ReplaceAllString(s, " ")
	s = regexp.MustCompile(`\{[^}]*\}`).ReplaceAllString(s, " ")
	for _, loc := range reIdent.FindAllStringIndex(s, -1) {
		id := s[loc[0]:loc[1]]
		if promqlKeywords[id] || reCall.MatchString(s[loc[1]:]) {
			continue // keyword, or function/aggregation call
		}
		if loc[0] > 0 && (s[loc[0]-1] >= '0' && s[loc[0]-1] <= '9' || s[loc[0]-1] == '.') {
			continue // exponent or unit of a number
		}
		metrics = append(metrics, id)
	}
	return metrics, grouping, matchers
}

// dashboardExprs walks the dashboard JSON and returns every PromQL
// expression: panel targets (including panels of collapsed rows) and
// template-variable queries.
func dashboardExprs(t *testing.T, v any, path string, out map[string]string) {
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			p := path + "." + k
			if s, ok := val.(string); ok && (k == "expr" || k == "definition") {
				out[p] = s
			}
			dashboardExprs(t, val, p, out)
		}
	case []any:
		for i, val := range x {
			dashboardExprs(t, val, path+"["+strconv.Itoa(i)+"]", out)
		}
	}
}

var reLabelValues = regexp.MustCompile(`^label_values\((.*),\s*(\w+)\)$`)

func TestDashboardNamesOnlyExistingSeries(t *testing.T) {
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardPath, err)
	}
	fams := allSeries(t)

	exprs := map[string]string{}
	dashboardExprs(t, dash, "", exprs)
	if len(exprs) < 20 {
		t.Fatalf("only %d expressions found in the dashboard", len(exprs))
	}
	used := map[string]bool{}
	for where, expr := range exprs {
		if m := reLabelValues.FindStringSubmatch(expr); m != nil {
			// label_values(selector, label): the label must exist on it.
			ms, _, _ := exprMetrics(m[1])
			for _, name := range ms {
				f := family(fams, name)
				if f == nil {
					t.Errorf("%s: %q names %s, which New does not register", where, expr, name)
				} else if !targetLabels[m[2]] && !hasLabel(f, m[2]) {
					t.Errorf("%s: %q: %s has no label %s", where, expr, name, m[2])
				}
			}
			continue
		}
		names, grouping, matchers := exprMetrics(expr)
		if len(names) == 0 {
			t.Errorf("%s: no metric found in %q", where, expr)
		}
		var selected []*dto.MetricFamily
		for _, name := range names {
			f := family(fams, name)
			if f == nil {
				t.Errorf("%s: %q names %s, which New does not register", where, expr, name)
				continue
			}
			used[f.GetName()] = true
			selected = append(selected, f)
			for _, mt := range matchers[name] {
				label, op, val := mt[0], mt[1], mt[2]
				if targetLabels[label] {
					continue
				}
				if !hasLabel(f, label) {
					t.Errorf("%s: %q matches %s on label %s, which it does not have", where, expr, name, label)
					continue
				}
				if (op == "=" || op == "!=") && !strings.Contains(val, "$") && !hasLabelValue(f, label, val) {
					t.Errorf("%s: %q matches %s{%s%s%q}, a value no series has", where, expr, name, label, op, val)
				}
			}
		}
		for _, l := range grouping {
			if targetLabels[l] {
				continue
			}
			found := false
			for _, f := range selected {
				if hasLabel(f, l) {
					found = true
				}
			}
			if !found {
				t.Errorf("%s: %q groups by %s, a label none of its metrics has", where, expr, l)
			}
		}
	}

	// The dashboard covers the main isolatord families.
	for _, name := range []string{
		"isolatord_containers", "isolatord_ephemeral_blocks", "isolatord_static_ports_held",
		"isolatord_operation_duration_seconds", "isolatord_operations_total", "isolatord_rpc_requests_total",
		"isolatord_rpc_duration_seconds", "isolatord_filter_operations_total", "isolatord_recovery_containers_total",
		"isolatord_recovery_strays_removed_total", "process_resident_memory_bytes", "process_cpu_seconds_total",
	} {
		if !used[name] {
			t.Errorf("the dashboard does not show %s", name)
		}
	}
	var list []string
	for n := range used {
		list = append(list, n)
	}
	sort.Strings(list)
	t.Logf("dashboard uses %d families: %v", len(list), list)
}

func TestDashboardStructure(t *testing.T) {
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		SchemaVersion int    `json:"schemaVersion"`
		UID           string `json:"uid"`
		Title         string `json:"title"`
		Templating    struct {
			List []struct {
				Name, Type string
				Query      any
			}
		}
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	if dash.SchemaVersion < 36 || dash.UID == "" || dash.Title == "" {
		t.Errorf("schemaVersion %d, uid %q, title %q", dash.SchemaVersion, dash.UID, dash.Title)
	}
	ds := false
	for _, v := range dash.Templating.List {
		if v.Name == "DS_PROMETHEUS" && v.Type == "datasource" && v.Query == "prometheus" {
			ds = true
		}
	}
	if !ds {
		t.Errorf("no datasource variable DS_PROMETHEUS of type prometheus")
	}
	ids := map[int]bool{}
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("duplicate panel id %d (%s)", p.ID, p.Title)
			}
			ids[p.ID] = true
			if p.Title == "" || p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
				t.Errorf("panel %d %q: bad title or gridPos %+v", p.ID, p.Title, p.GridPos)
			}
			if p.Type != "row" {
				if p.Datasource.UID != "${DS_PROMETHEUS}" || len(p.Targets) == 0 {
					t.Errorf("panel %q: datasource %q, %d targets", p.Title, p.Datasource.UID, len(p.Targets))
				}
				refs := map[string]bool{}
				for _, tg := range p.Targets {
					if tg.Datasource.UID != "${DS_PROMETHEUS}" || tg.RefID == "" || refs[tg.RefID] || tg.Expr == "" {
						t.Errorf("panel %q: bad target %+v", p.Title, tg)
					}
					refs[tg.RefID] = true
				}
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ X, Y, W, H int } `json:"gridPos"`
	Targets []struct {
		Expr       string `json:"expr"`
		RefID      string `json:"refId"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

// The checker itself finds what it must.
func TestExprMetrics(t *testing.T) {
	names, grouping, matchers := exprMetrics(`histogram_quantile(0.99, sum by (op, le) (rate(isolatord_operation_duration_seconds_bucket{job=~"$job", code!="OK"}[$__rate_interval]))) / on (job) group_left foo_total * 1e3`)
	if strings.Join(names, ",") != "isolatord_operation_duration_seconds_bucket,foo_total" {
		t.Errorf("names = %v", names)
	}
	if strings.Join(grouping, ",") != "op,le,job" {
		t.Errorf("grouping = %v", grouping)
	}
	if m := matchers["isolatord_operation_duration_seconds_bucket"]; len(m) != 2 || m[1] != [3]string{"code", "!=", "OK"} {
		t.Errorf("matchers = %v", m)
	}
	fams := allSeries(t)
	if family(fams, "isolatord_operation_duration_seconds_bucket") == nil || family(fams, "isolatord_containers_bucket") != nil || family(fams, "isolatord_no_such") != nil {
		t.Errorf("family resolution is wrong")
	}
}
