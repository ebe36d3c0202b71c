package metrics

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
)

const (
	dashboardPath = "../../deploy/grafana/lanekit.json"
	// The lanekit-vhost backend exports its own metrics; its Rust test
	// (vhost/src/metrics.rs) keeps this list equal to what it exports.
	vhostDashboardPath = "../../deploy/grafana/lanekit-vhost.json"
	vhostMetricsPath   = "../../deploy/grafana/lanekit-vhost-metrics.txt"
)

// queries collects every PromQL string of a Grafana dashboard: panel and
// target "expr"s and the templating queries.
func queries(v any, out *[]string) {
	switch x := v.(type) {
	case map[string]any:
		for k, c := range x {
			if s, ok := c.(string); ok && (k == "expr" || k == "query" && strings.Contains(s, "(")) {
				*out = append(*out, s)
				continue
			}
			queries(c, out)
		}
	case []any:
		for _, c := range x {
			queries(c, out)
		}
	}
}

var (
	metricRef   = regexp.MustCompile(`\blanekit_[a-zA-Z0-9_]+`)
	selectorRef = regexp.MustCompile(`\b(lanekit_[a-zA-Z0-9_]+)\{([^}]*)\}`)
	matcherName = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	groupRef    = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
)

// registered gathers the registry filled from the fake agent (and one API
// call) and returns each family's label names.
func registered(t *testing.T) map[string]map[string]bool {
	t.Helper()
	m := New(Options{Log: quiet()})
	if err := m.Watch(newFakeSource()); err != nil {
		t.Fatal(err)
	}
	m.UnaryInterceptor(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/lanekit.v1.Agent/AddEndpoint"},
		func(context.Context, any) (any, error) { return nil, nil })
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]bool{}
	for _, f := range fams {
		labels := map[string]bool{"instance": true, "job": true} // added by Prometheus
		for _, mm := range f.GetMetric() {
			for _, l := range mm.GetLabel() {
				labels[l.GetName()] = true
			}
		}
		out[f.GetName()] = labels
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				hl := map[string]bool{"le": s == "_bucket"}
				for k := range labels {
					hl[k] = true
				}
				out[f.GetName()+s] = hl
			}
		}
	}
	return out
}

// TestDashboardUsesRegisteredMetrics: every metric and label the dashboard
// queries exists in the registry, and every registered family is shown.
func TestDashboardUsesRegisteredMetrics(t *testing.T) {
	checkDashboard(t, dashboardPath, registered(t))
}

// TestVhostDashboardUsesBackendMetrics: the same for the backend dashboard
// against the backend's golden list ("name label,label" per line).
func TestVhostDashboardUsesBackendMetrics(t *testing.T) {
	raw, err := os.ReadFile(vhostMetricsPath)
	if err != nil {
		t.Fatal(err)
	}
	reg := map[string]map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		name, labels, _ := strings.Cut(line, " ")
		set := map[string]bool{"instance": true, "job": true}
		for _, l := range strings.Split(labels, ",") {
			set[l] = true
		}
		reg[name] = set
	}
	if len(reg) < 10 || reg["lanekit_vhost_rx_packets_total"] == nil {
		t.Fatalf("%s lists %d metrics", vhostMetricsPath, len(reg))
	}
	checkDashboard(t, vhostDashboardPath, reg)
}

func checkDashboard(t *testing.T, path string, reg map[string]map[string]bool) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard is not JSON: %v", err)
	}
	var qs []string
	queries(dash, &qs)
	if len(qs) < 10 {
		t.Fatalf("only %d queries found in the dashboard", len(qs))
	}
	used := map[string]bool{}
	for _, q := range qs {
		names := metricRef.FindAllString(q, -1)
		if len(names) == 0 {
			t.Errorf("query uses no lanekit metric: %s", q)
		}
		exprLabels := map[string]bool{}
		for _, n := range names {
			labels, ok := reg[n]
			if !ok {
				t.Errorf("dashboard uses %s, which the registry does not have (query %s)", n, q)
				continue
			}
			used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_count"), "_sum")] = true
			for l := range labels {
				exprLabels[l] = true
			}
		}
		for _, sel := range selectorRef.FindAllStringSubmatch(q, -1) {
			for _, mt := range matcherName.FindAllStringSubmatch(sel[2], -1) {
				if labels, ok := reg[sel[1]]; ok && !labels[mt[1]] {
					t.Errorf("%s has no label %q (query %s)", sel[1], mt[1], q)
				}
			}
		}
		for _, g := range groupRef.FindAllStringSubmatch(q, -1) {
			for _, l := range strings.Split(g[1], ",") {
				if l = strings.TrimSpace(l); l != "" && !exprLabels[l] {
					t.Errorf("grouping by %q, which none of %v has (query %s)", l, names, q)
				}
			}
		}
	}
	for name := range reg {
		if strings.HasSuffix(name, "_bucket") || strings.HasSuffix(name, "_sum") || strings.HasSuffix(name, "_count") {
			continue
		}
		if !used[name] {
			t.Errorf("registered metric %s is not on the dashboard", name)
		}
	}
}
