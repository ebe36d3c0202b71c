package bench

import (
	"fmt"
	"io"
	"math"
	"sort"
	"text/tabwriter"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
)

// SvcReport is the services section of a run (`services` in the JSON).
type SvcReport struct {
	Repeat    int      `json:"repeat"`
	DurationS float64  `json:"duration_s"`
	BusyCPUs  bool     `json:"busy_cpus"`
	Rows      []SvcRow `json:"rows"`
	// Targets are issue 12's service goals checked against this run.
	Targets []SvcTarget `json:"targets,omitempty"`
}

// SvcRow is one service row: the pod rows' fields (path, client, VIP as
// server_ip, conn/s and RR with ranges and per-repetition values, errors,
// includes) plus the service count and programming times.
type SvcRow struct {
	Row
	Mode         string   `json:"mode"`
	Services     int      `json:"services"`
	ServicePorts int      `json:"service_ports"`
	Endpoints    int      `json:"endpoints"`
	Backends     []string `json:"backends"`
	NodeNS       string   `json:"node_netns,omitempty"`
	// ProgramMs: time to program all services; ChangeMs: one endpoint
	// removed from one service; ChangeBackMs: the same endpoint restored.
	ProgramMs   Summary `json:"program_ms"`
	ProgramWhat string  `json:"program_what"`
	// ProgramNote: the timed programming step did not finish (ProgramMs is
	// then empty) and how the rules were loaded instead.
	ProgramNote  string  `json:"program_note,omitempty"`
	ChangeMs     Summary `json:"change_ms"`
	ChangeBackMs Summary `json:"change_back_ms"`
	ChangeWhat   string  `json:"change_what"`
	// DatapathProgramMs / DatapathChangeMs: lanekit's datapath alone
	// (SvcPath.Datapath), what DatapathWhat says; empty for other rows.
	DatapathProgramMs Summary    `json:"datapath_program_ms"`
	DatapathChangeMs  Summary    `json:"datapath_change_ms"`
	DatapathWhat      string     `json:"datapath_what,omitempty"`
	DatapathReps      []*float64 `json:"datapath_program_ms_reps,omitempty"`
	DatapathChange    []*float64 `json:"datapath_change_ms_reps,omitempty"`
	ProgramReps       []*float64 `json:"program_ms_reps"`
	ChangeReps        []*float64 `json:"change_ms_reps"`
	ChangeBack        []*float64 `json:"change_back_ms_reps"`
	// VsIptables: per-repetition ratios to the kube-proxy-iptables row with
	// the same service count; VsFewest: to this mode's row with the fewest
	// services (flatness).
	VsIptables *PairedRatios `json:"paired_to_iptables,omitempty"`
	VsFewest   *PairedRatios `json:"paired_to_fewest,omitempty"`
	// RawCPS: the same client between the lab's raw hosts right after each
	// conn/s run (SvcPath.Raw), the physical limit; CPSVsRaw: conn/s over
	// it per repetition, which compares labs measured one after the other.
	RawCPS     Summary    `json:"raw_cps"`
	RawCPSReps []*float64 `json:"raw_cps_reps,omitempty"`
	CPSVsRaw   *Summary   `json:"cps_vs_raw,omitempty"`
	// ProxyMetrics: the proxy's own histograms around the timed programming
	// step (ProxyMetricsReader); ProxyMetricsNote: why they could not be read.
	ProxyMetrics     []ProxyMetric `json:"proxy_metrics,omitempty"`
	ProxyMetricsNote string        `json:"proxy_metrics_note,omitempty"`
}

// SvcTarget is one service goal checked against a run.
type SvcTarget struct {
	What  string   `json:"what"`
	Want  string   `json:"want"`
	Value *Summary `json:"value,omitempty"` // nil: not measured
	Unit  string   `json:"unit"`            // "×" (paired ratio) or "ms"
	Met   bool     `json:"met"`
}

func (t SvcTarget) String() string {
	if t.Value == nil {
		return fmt.Sprintf("%s %s: not measured", t.What, t.Want)
	}
	verdict := "missed"
	if t.Met {
		verdict = "met"
	}
	return fmt.Sprintf("%s %s: %s %s (%s–%s), %s", t.What, t.Want, num(t.Value.Median), t.Unit,
		num(t.Value.Min), num(t.Value.Max), verdict)
}

// num prints a figure unrounded enough to judge a bound (4 significant
// digits at least).
func num(x float64) string {
	switch {
	case math.Abs(x) >= 100:
		return fmt.Sprintf("%.1f", x)
	case math.Abs(x) >= 1:
		return fmt.Sprintf("%.3f", x)
	}
	return fmt.Sprintf("%.4f", x)
}

func buildSvcReport(paths []SvcPath, all []svcSamples, o SvcOptions) *SvcReport {
	r := &SvcReport{Repeat: o.Repeat, DurationS: o.Duration.Seconds(), BusyCPUs: o.BusyCPUs}
	for i, p := range paths {
		s := &all[i]
		p50, p99, cps := Summarize(s.p50), Summarize(s.p99), Summarize(s.cps)
		var backends []string
		for _, b := range p.Backends {
			backends = append(backends, b.NS+" "+b.IP.String())
		}
		ports := 0
		for _, svc := range s.set.Services {
			ports += len(svc.Ports)
		}
		used := s.set.Services[s.set.Used]
		bpfTotal, bpfProgs := bpfCostOf(&s.bpfConn)
		bpfRR, bpfProgsRR := bpfCostOf(&s.bpfRR)
		r.Rows = append(r.Rows, SvcRow{
			Row: Row{
				BPFNsPerConn: bpfTotal, BPFPrograms: bpfProgs, BPFNsPerRR: bpfRR, BPFProgramsRR: bpfProgsRR,
				Path: "svc-" + p.Mode, ClientNS: p.ClientNS, ServerNS: p.NodeNS, ServerIP: used.IP.String(), Server: "netns",
				RRP50us: p50.Median, RRP50Range: p50, RRP99us: p99.Median, RRP99Range: p99,
				CPS: cps.Median, CPSRange: cps, Errors: s.errs, Includes: p.Includes,
				Reps:     Reps{RRP50us: reps(s.p50), RRP99us: reps(s.p99), CPS: reps(s.cps), CPSErrors: reps(s.cpsErrs)},
				CPSConns: int64(sum(s.cpsConns)), CPSErrors: int64(sum(s.cpsErrs)), CPSErrorKinds: s.cpsKinds,
			},
			Mode: p.Mode, Services: p.Services, ServicePorts: ports, Endpoints: s.set.Endpoints(),
			Backends: backends, NodeNS: p.NodeNS,
			ProgramMs: Summarize(s.program), ProgramWhat: p.Prog.ProgramLabel(), ProgramNote: s.programNote,
			ChangeMs: Summarize(s.change), ChangeBackMs: Summarize(s.changeBack), ChangeWhat: p.Prog.ChangeLabel(),
			ProgramReps: reps(s.program), ChangeReps: reps(s.change), ChangeBack: reps(s.changeBack),
			RawCPS: Summarize(s.rawCPS), RawCPSReps: reps(s.rawCPS),
			ProxyMetrics: s.proxyMetrics, ProxyMetricsNote: s.proxyMetricsNote,
		})
		if p.Datapath != nil {
			row := &r.Rows[len(r.Rows)-1]
			row.DatapathProgramMs, row.DatapathChangeMs = Summarize(s.dpProgram), Summarize(s.dpChange)
			row.DatapathWhat, row.DatapathReps, row.DatapathChange = p.Datapath.ProgramLabel(), reps(s.dpProgram), reps(s.dpChange)
		}
	}
	r.Compute()
	return r
}

// Compute fills the paired ratios and the targets from the per-repetition
// values (also after loading a saved report).
func (r *SvcReport) Compute() {
	fewest := map[string]*SvcRow{}
	for i := range r.Rows {
		row := &r.Rows[i]
		if f := fewest[row.Mode]; f == nil || row.Services < f.Services {
			fewest[row.Mode] = row
		}
	}
	for i := range r.Rows {
		row := &r.Rows[i]
		row.VsIptables, row.VsFewest = nil, nil
		row.CPSVsRaw = pairedRatio(row.Reps.CPS, row.RawCPSReps)
		iptables := SvcModeIptables
		if _, host := SvcBaseMode(row.Mode); host {
			iptables = SvcModeIptablesHost // host clients against host clients
		}
		if ref := r.find(iptables, row.Services); ref != nil && ref != row {
			row.VsIptables = svcPaired(row, ref)
		}
		if ref := fewest[row.Mode]; ref != nil && ref != row {
			row.VsFewest = svcPaired(row, ref)
		}
	}
	r.Targets = r.checkTargets()
}

func svcPaired(row, ref *SvcRow) *PairedRatios {
	return &PairedRatios{
		RRP50us: pairedRatio(row.Reps.RRP50us, ref.Reps.RRP50us),
		RRP99us: pairedRatio(row.Reps.RRP99us, ref.Reps.RRP99us),
		CPS:     pairedRatio(row.Reps.CPS, ref.Reps.CPS),
	}
}

func (r *SvcReport) find(mode string, services int) *SvcRow {
	for i := range r.Rows {
		if r.Rows[i].Mode == mode && r.Rows[i].Services == services {
			return &r.Rows[i]
		}
	}
	return nil
}

// Issue 12's service targets.
const (
	svcFlatBound      = 0.05 // lanekit within ±5 % from the fewest to the most services
	svcCPSvsIptables  = 1.3  // lanekit conn/s ≥ 1.3 × iptables mode at the most services
	svcProgramBoundMs = 1000 // program all services + endpoints
	svcChangeBoundMs  = 10   // one change
)

// checkTargets evaluates the goals on the lanekit row with the most
// services (and the fewest, for flatness); goals whose rows are absent are
// reported as not measured only when lanekit rows exist.
func (r *SvcReport) checkTargets() []SvcTarget {
	var lk []*SvcRow
	for i := range r.Rows {
		if r.Rows[i].Mode == SvcModeLanekit {
			lk = append(lk, &r.Rows[i])
		}
	}
	if len(lk) == 0 {
		return nil
	}
	sort.Slice(lk, func(i, j int) bool { return lk[i].Services < lk[j].Services })
	lo, hi := lk[0], lk[len(lk)-1]
	var out []SvcTarget
	if lo != hi {
		for _, m := range []struct {
			name string
			get  func(*PairedRatios) *Summary
		}{
			{"conn/s", func(p *PairedRatios) *Summary { return p.CPS }},
			{"RR p50", func(p *PairedRatios) *Summary { return p.RRP50us }},
			{"RR p99", func(p *PairedRatios) *Summary { return p.RRP99us }},
		} {
			t := SvcTarget{What: fmt.Sprintf("lanekit %s at %d vs %d services", m.name, hi.Services, lo.Services),
				Want: fmt.Sprintf("within ±%.0f %%", svcFlatBound*100), Unit: "×"}
			if hi.VsFewest != nil {
				t.Value = m.get(hi.VsFewest)
			}
			t.Met = t.Value != nil && math.Abs(t.Value.Median-1) <= svcFlatBound
			out = append(out, t)
		}
	}
	t := SvcTarget{What: fmt.Sprintf("lanekit conn/s at %d services vs kube-proxy iptables mode", hi.Services),
		Want: fmt.Sprintf(">= %.2f ×", svcCPSvsIptables), Unit: "×"}
	if hi.VsIptables != nil {
		t.Value = hi.VsIptables.CPS
	}
	t.Met = t.Value != nil && t.Value.Median >= svcCPSvsIptables
	out = append(out, t)
	bounds := []struct {
		what  string
		s     Summary
		bound float64
	}{
		{fmt.Sprintf("lanekit programming %d services + %d endpoints (agent end to end)", hi.Services, hi.Endpoints), hi.ProgramMs, svcProgramBoundMs},
		{fmt.Sprintf("lanekit one change at %d services (agent end to end)", hi.Services), hi.ChangeMs, svcChangeBoundMs},
	}
	if hi.DatapathWhat != "" {
		bounds = append(bounds, []struct {
			what  string
			s     Summary
			bound float64
		}{
			{fmt.Sprintf("lanekit programming %d services + %d endpoints (datapath only: translate + ApplyServices)", hi.Services, hi.Endpoints), hi.DatapathProgramMs, svcProgramBoundMs},
			{fmt.Sprintf("lanekit one change at %d services (datapath only)", hi.Services), hi.DatapathChangeMs, svcChangeBoundMs},
		}...)
	}
	for _, m := range bounds {
		t := SvcTarget{What: m.what, Want: fmt.Sprintf("<= %g ms", m.bound), Unit: "ms"}
		if m.s != (Summary{}) {
			s := m.s
			t.Value = &s
		}
		t.Met = t.Value != nil && t.Value.Median <= m.bound
		out = append(out, t)
	}
	return out
}

// Failed reports whether any service measurement failed.
func (r *SvcReport) Failed() bool {
	for _, row := range r.Rows {
		if len(row.Errors) > 0 {
			return true
		}
	}
	return false
}

// WriteTable prints the services section: one line per row with medians
// (min–max), paired ratios, programming and change times, then the labels,
// targets and errors.
func (r *SvcReport) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "\nservices: client pod -> ClusterIP (VIP) of one service among N, backends are real pods on node 2; %d × %gs per metric, rows interleaved\n",
		r.Repeat, r.DurationS)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "row\tservices\tendpoints\tconn/s\t×iptables\t×fewest\t×raw\tRR p50 µs\tRR p99 µs\t×iptables p99\tprogram ms\tone change ms\trestore ms\tconn errors\t")
	for _, row := range r.Rows {
		var vi, vf PairedRatios
		if row.VsIptables != nil {
			vi = *row.VsIptables
		}
		if row.VsFewest != nil {
			vf = *row.VsFewest
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t\n", row.Mode, row.Services, row.Endpoints,
			spread(row.CPSRange, "%.0f"), pairedText(vi.CPS), pairedText(vf.CPS), pairedText(row.CPSVsRaw),
			spread(row.RRP50Range, "%.1f"), spread(row.RRP99Range, "%.1f"), pairedText(vi.RRP99us),
			programText(row), spread(row.ChangeMs, "%.2f"), spread(row.ChangeBackMs, "%.2f"), row.CPSErrors)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write services table: %w", err)
	}
	fmt.Fprintln(w, "×iptables: per-repetition ratio to kube-proxy-iptables with the same services; ×fewest: to the same mode with the fewest services; median (min–max)")
	legend := false
	for _, row := range r.Rows {
		if row.CPSVsRaw == nil {
			continue
		}
		if !legend {
			fmt.Fprintln(w, "×raw: conn/s over the same client's between the lab's two raw hosts (no rules, no BPF: the physical limit), measured right after it, per repetition")
			legend = true
		}
		fmt.Fprintf(w, "raw hosts: %s/%d: %s conn/s\n", row.Mode, row.Services, spread(row.RawCPS, "%.0f"))
	}
	seen := map[string]bool{}
	for _, row := range r.Rows {
		if seen[row.Mode] {
			continue
		}
		seen[row.Mode] = true
		fmt.Fprintf(w, "includes: %s: %s\n", row.Mode, row.Includes.Detail)
		fmt.Fprintf(w, "program: %s: %s\n", row.Mode, row.ProgramWhat)
		fmt.Fprintf(w, "change: %s: %s\n", row.Mode, row.ChangeWhat)
	}
	for _, t := range r.Targets {
		fmt.Fprintf(w, "target: %s\n", t)
	}
	bpfRows := make([]Row, len(r.Rows))
	for i, row := range r.Rows {
		bpfRows[i] = row.Row
		bpfRows[i].Path = fmt.Sprintf("%s/%d", row.Mode, row.Services)
	}
	writeBPFCost(w, bpfRows)
	writeProxyMetrics(w, r.Rows)
	for _, row := range r.Rows {
		if row.DatapathWhat != "" {
			fmt.Fprintf(w, "datapath only: %s/%d: program %s ms, one change %s ms (%s)\n", row.Mode, row.Services,
				spread(row.DatapathProgramMs, "%.1f"), spread(row.DatapathChangeMs, "%.2f"), row.DatapathWhat)
		}
	}
	for _, row := range r.Rows {
		if row.ProgramNote != "" {
			fmt.Fprintf(w, "program: %s/%d: %s\n", row.Mode, row.Services, row.ProgramNote)
		}
		if row.CPSErrors > 0 {
			fmt.Fprintf(w, "conn errors: %s/%d: %d of %d attempts (%s)\n", row.Mode, row.Services,
				row.CPSErrors, row.CPSErrors+row.CPSConns, kindsText(row.CPSErrorKinds))
		}
		for _, e := range row.Errors {
			fmt.Fprintf(w, "error: %s/%d: %s\n", row.Mode, row.Services, e)
		}
	}
	return nil
}

// panels draws the service rows: conn/s and RR through the VIP, and the
// time to program all services on a log scale (milliseconds to minutes).
func (r *SvcReport) panels() ([]*plot.Plot, error) {
	rows := make([]Row, len(r.Rows))
	names := make([]string, len(r.Rows))
	n := len(r.Rows)
	for i, row := range r.Rows {
		rows[i] = row.Row
		rows[i].Path = fmt.Sprintf("%s/%d", row.Mode, row.Services)
		names[n-1-i] = rows[i].Path
	}
	cps, err := summaryPanel(rows, "services: conn/s through the VIP", "conn/s (higher is better)",
		func(r Row) Summary { return r.CPSRange }, "%.0f")
	if err != nil {
		return nil, err
	}
	rr, err := latencyPanel(rows, "services: RR round trip through the VIP")
	if err != nil {
		return nil, err
	}
	prog := plot.New()
	prog.Title.Text, prog.X.Label.Text = "services: program all (log scale)", "ms (lower is better)"
	prog.X.Scale, prog.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	pts := errorPoints{}
	labels := plotter.XYLabels{}
	lo, hi := math.Inf(1), 0.0
	for i, row := range r.Rows {
		s, y := row.ProgramMs, float64(n-1-i)
		text := "not measured"
		if s != (Summary{}) && s.Min > 0 {
			pts.xys = append(pts.xys, plotter.XY{X: s.Median, Y: y})
			pts.errs = append(pts.errs, struct{ Low, High float64 }{s.Median - s.Min, s.Max - s.Median})
			text = fmt.Sprintf("%.1f ms", s.Median)
			lo, hi = min(lo, s.Min), max(hi, s.Max)
			labels.XYs = append(labels.XYs, plotter.XY{X: s.Max, Y: y})
			labels.Labels = append(labels.Labels, "  "+text)
		}
	}
	for i, row := range r.Rows {
		if row.ProgramMs == (Summary{}) && row.ProgramNote != "" && len(pts.xys) > 0 {
			labels.XYs = append(labels.XYs, plotter.XY{X: lo / 2, Y: float64(n - 1 - i)})
			labels.Labels = append(labels.Labels, "  timed full sync did not finish (see table)")
		}
	}
	if len(pts.xys) > 0 {
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return nil, fmt.Errorf("chart: %w", err)
		}
		sc.Color = colourMedian
		eb, err := plotter.NewXErrorBars(pts)
		if err != nil {
			return nil, fmt.Errorf("chart: %w", err)
		}
		prog.Add(sc, eb)
		if err := addLabels(prog, labels); err != nil {
			return nil, err
		}
		prog.X.Min, prog.X.Max = lo/2, hi*40
	}
	for _, p := range []*plot.Plot{cps, rr, prog} {
		p.NominalY(names...)
		p.Y.Padding = 0
		p.Y.Min, p.Y.Max = -0.6, float64(n-1)+0.6
		p.Add(plotter.NewGrid())
	}
	cps.X.Min, rr.X.Min = 0, 0
	cps.X.Padding, rr.X.Padding = 0, 0
	return []*plot.Plot{cps, rr, prog}, nil
}

// programText is the program column: median (min–max), or "> limit" when
// the timed step never finished.
func programText(row SvcRow) string {
	if row.ProgramMs == (Summary{}) && row.ProgramNote != "" {
		return "not finished (see below)"
	}
	return spread(row.ProgramMs, "%.1f")
}
