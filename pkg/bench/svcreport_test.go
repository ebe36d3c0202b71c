package bench

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func ptrs(xs ...float64) []*float64 {
	out := make([]*float64, len(xs))
	for i := range xs {
		out[i] = &xs[i]
	}
	return out
}

func svcRow(mode string, n int, cps, p50, p99 []*float64, program, change Summary) SvcRow {
	return SvcRow{Row: Row{Path: "svc-" + mode, Reps: Reps{CPS: cps, RRP50us: p50, RRP99us: p99}}, Mode: mode, Services: n,
		Endpoints: 4 * n, ProgramMs: program, ChangeMs: change}
}

// Targets from per-repetition values: flatness against lanekit's fewest
// services, conn/s against iptables at the most, programming bounds.
func TestSvcReportTargets(t *testing.T) {
	r := &SvcReport{Repeat: 3, DurationS: 5, Rows: []SvcRow{
		svcRow(SvcModeIptables, 10, ptrs(1000, 1000, 1000), ptrs(30, 30, 30), ptrs(50, 50, 50), Summary{5, 6, 7}, Summary{20, 30, 40}),
		svcRow(SvcModeIptables, 10000, ptrs(500, 400, 600), ptrs(31, 31, 31), ptrs(60, 60, 60), Summary{1e5, 1e5, 1e5}, Summary{900, 1000, 1100}),
		svcRow(SvcModeLanekit, 10, ptrs(1000, 1100, 900), ptrs(25, 25, 25), ptrs(40, 40, 40), Summary{2, 3, 4}, Summary{1, 1, 1}),
		// conn/s 0.98/1.0/1.0 of the 10-service row; p99 1.2 ×: not flat.
		svcRow(SvcModeLanekit, 10000, ptrs(980, 1100, 900), ptrs(25, 25, 25), ptrs(48, 48, 48), Summary{800, 900, 1200}, Summary{8, 12, 30}),
	}}
	r.Compute()
	got := map[string]SvcTarget{}
	for _, tg := range r.Targets {
		got[tg.What] = tg
	}
	check := func(what string, met bool, median float64) {
		t.Helper()
		tg, ok := got[what]
		if !ok {
			t.Fatalf("no target %q in %+v", what, r.Targets)
		}
		if tg.Value == nil || tg.Met != met || tg.Value.Median != median {
			t.Errorf("%s: met %v value %+v, want met %v median %g", what, tg.Met, tg.Value, met, median)
		}
	}
	check("lanekit conn/s at 10000 vs 10 services", true, 1)
	check("lanekit RR p50 at 10000 vs 10 services", true, 1)
	check("lanekit RR p99 at 10000 vs 10 services", false, 1.2)
	check("lanekit conn/s at 10000 services vs kube-proxy iptables mode", true, 1.96)
	check("lanekit programming 10000 services + 40000 endpoints (agent end to end)", true, 900)
	check("lanekit one change at 10000 services (agent end to end)", false, 12)
	if lk := r.find(SvcModeLanekit, 10000); lk.VsIptables == nil || lk.VsIptables.CPS.Min != 1.5 || lk.VsIptables.CPS.Max != 2.75 {
		t.Errorf("paired conn/s to iptables: %+v", lk.VsIptables)
	}
	if ipt := r.find(SvcModeIptables, 10); ipt.VsIptables != nil || ipt.VsFewest != nil {
		t.Error("the reference row is compared with itself")
	}

	// Without lanekit rows there are no targets; without the iptables row
	// at the same count the comparison is "not measured".
	r2 := &SvcReport{Rows: []SvcRow{r.Rows[0], r.Rows[1]}}
	r2.Compute()
	if len(r2.Targets) != 0 {
		t.Errorf("targets without lanekit rows: %+v", r2.Targets)
	}
	r3 := &SvcReport{Rows: []SvcRow{r.Rows[2], r.Rows[3]}}
	r3.Compute()
	for _, tg := range r3.Targets {
		if strings.Contains(tg.What, "iptables") && (tg.Value != nil || tg.Met || !strings.Contains(tg.String(), "not measured")) {
			t.Errorf("iptables comparison without an iptables row: %+v", tg)
		}
	}
}

// The table prints every row with its programming times and the targets,
// and the JSON round trip keeps the per-repetition values the ratios come
// from.
func TestSvcReportTableJSON(t *testing.T) {
	rep := &Report{Repeat: 3, DurationS: 5, Services: &SvcReport{Repeat: 3, DurationS: 5, Rows: []SvcRow{
		svcRow(SvcModeIptables, 10000, ptrs(500, 400, 600), ptrs(31, 31, 31), ptrs(60, 60, 60), Summary{1e5, 1e5, 1e5}, Summary{900, 1000, 1100}),
		svcRow(SvcModeLanekit, 10000, ptrs(980, 1100, 900), ptrs(25, 25, 25), ptrs(48, 48, 48), Summary{800, 900, 1200}, Summary{8, 12, 30}),
	}}}
	rep.Services.Rows[0].Errors = []string{"rep 2 cps: boom"}
	rep.Services.Rows[1].RawCPSReps, rep.Services.Rows[1].RawCPS = ptrs(1000, 1000, 1200), Summary{Median: 1000, Min: 1000, Max: 1200}
	rep.Services.Rows[1].BPFNsPerConn = &Summary{Median: 10200, Min: 10100, Max: 10400}
	rep.Services.Rows[1].BPFPrograms = []BPFProgramCost{{Name: "from_pod", NsPerConn: 6600, RunsPerConn: 8}}
	rep.Services.Compute()
	var tb bytes.Buffer
	if err := rep.WriteTable(&tb); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kube-proxy-iptables  10000", "100000.0 (100000.0–100000.0)", "12.00 (8.00–30.00)",
		"1.96 (1.50–2.75)", "target: lanekit conn/s at 10000 services vs kube-proxy iptables mode >= 1.30 ×: 1.960 × (1.500–2.750), met",
		"error: kube-proxy-iptables/10000: rep 2 cps: boom",
		"  lanekit/10000                10.2 µs (10.1–10.4): from_pod 6.6 µs (8.0 runs)",
		"0.98 (0.75–1.10)", "raw hosts: lanekit/10000: 1000 (1000–1200) conn/s"} {
		if !strings.Contains(tb.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tb.String())
		}
	}
	if strings.Contains(tb.String(), "raw hosts: kube-proxy-iptables") {
		t.Errorf("a row without raw measurements lists raw hosts:\n%s", tb.String())
	}
	if !rep.Failed() {
		t.Error("a failed service measurement does not fail the report")
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	back.Services.Targets = nil
	back.ComputeRatios()
	if len(back.Services.Targets) != len(rep.Services.Targets) || back.Services.Rows[1].Services != 10000 ||
		*back.Services.Rows[1].Reps.CPS[1] != 1100 || back.Services.Rows[1].Path != "svc-lanekit" {
		t.Errorf("round trip lost data: %+v", back.Services)
	}
	var png bytes.Buffer
	if err := rep.WriteChart(&png); err != nil || !bytes.HasPrefix(png.Bytes(), []byte("\x89PNG")) {
		t.Errorf("chart of a services-only report: %v", err)
	}
}

// The proxies' own histograms print beside each row's first-answer time,
// with what each measures once, and a failed read says why.
func TestWriteProxyMetrics(t *testing.T) {
	nw := ProxyMetric{Name: "kubeproxy_network_programming_duration_seconds", Labels: `{ip_family="IPv4"}`,
		What: "trigger time to the rules synced", Count: 1, Ms: 812.5}
	rows := []SvcRow{
		{Mode: "kube-proxy-nftables", Services: 1000, ProgramMs: Summary{900, 900, 900},
			ProxyMetrics: []ProxyMetric{nw, {Name: "kubeproxy_sync_proxy_rules_duration_seconds", What: "one sync", Count: 2, Ms: 40}}},
		{Mode: "kube-proxy-nftables", Services: 10000, ProgramMs: Summary{950, 950, 950}, ProxyMetrics: []ProxyMetric{nw}},
		{Mode: "cilium", Services: 1000, ProgramMs: Summary{200, 200, 200}, ProxyMetricsNote: "not read before the write: refused"},
		{Mode: "lanekit", Services: 1000, ProgramMs: Summary{20, 20, 20}},
	}
	var b bytes.Buffer
	writeProxyMetrics(&b, rows)
	out := b.String()
	for _, want := range []string{
		"own metrics: kube-proxy-nftables/1000: first answer 900.0 ms; kubeproxy_network_programming_duration_seconds{ip_family=\"IPv4\"} 812.5 ms (1 observation); kubeproxy_sync_proxy_rules_duration_seconds 40.0 ms (2 observations)\n",
		"own metrics: cilium/1000: first answer 200.0 ms; not read before the write: refused\n",
		"own metric: kubeproxy_network_programming_duration_seconds: trigger time to the rules synced\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	if strings.Count(out, "own metric: kubeproxy_network_programming_duration_seconds:") != 1 || strings.Contains(out, "lanekit/1000") {
		t.Errorf("each metric explained once, rows without metrics left out:\n%s", out)
	}
	b.Reset()
	writeProxyMetrics(&b, rows[3:])
	if b.Len() != 0 {
		t.Errorf("no metrics: printed %q", b.String())
	}
}
