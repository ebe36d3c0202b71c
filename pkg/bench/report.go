package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"golang.org/x/sys/unix"
)

// Report is the outcome of one benchmark run; its JSON form is the
// `lanekit lab bench --json` document.
type Report struct {
	Machine   Machine `json:"machine"`
	Repeat    int     `json:"repeat"`
	DurationS float64 `json:"duration_s"`
	// BusyCPUs: RR ran with SCHED_IDLE spinners on every CPU.
	BusyCPUs bool  `json:"busy_cpus"`
	Rows     []Row `json:"rows"`
	// Targets are the foundation's goals, checked against the paired ratios.
	Targets []TargetResult `json:"targets,omitempty"`
	// VMBackend compares lanekit-vhost with DPDK testpmd (nil when not run).
	VMBackend *BackendReport `json:"vm_backend,omitempty"`
	// Services: the service rows (kube-proxy iptables/nftables vs lanekit;
	// nil when not run).
	Services *SvcReport `json:"services,omitempty"`
	// BigTCP: lanekit pod to pod with BIG TCP on and off (bigtcp.go; nil
	// when not run).
	BigTCP *BigTCPReport `json:"big_tcp,omitempty"`
}

// Row holds one path's results: TCP throughput as min/median/max, the other
// metrics as medians with their ranges as siblings.
type Row struct {
	Path     string  `json:"path"`
	ClientNS string  `json:"client_netns"`
	ServerNS string  `json:"server_netns"`
	ServerIP string  `json:"server_ip"`
	Server   string  `json:"server"` // "netns" or "guest:<vm>"
	Note     string  `json:"note,omitempty"`
	TCPGbps  Summary `json:"tcp_gbps"`
	// TCPRevGbps: guest rows only, TCP with the guest sending (iperf3 -R).
	TCPRevGbps *Summary `json:"tcp_rev_gbps,omitempty"`
	// HostCPU: guest rows only, what the host spent (all CPU but the
	// guests' vCPU threads) at a fixed offered load (hostcpu.go).
	HostCPU *HostCPU `json:"host_cpu,omitempty"`
	// GuestOffloads: guest rows only, the virtio offloads the guest's
	// driver negotiated, read inside the guest (vmfeatures.go).
	GuestOffloads string   `json:"guest_offloads,omitempty"`
	RRP50us       float64  `json:"rr_p50_us"`
	RRP50Range    Summary  `json:"rr_p50_us_range"`
	RRP99us       float64  `json:"rr_p99_us"`
	RRP99Range    Summary  `json:"rr_p99_us_range"`
	CPS           float64  `json:"cps"`
	CPSRange      Summary  `json:"cps_range"`
	RatioToHost   *Ratios  `json:"ratio_to_host,omitempty"`
	Errors        []string `json:"errors,omitempty"`

	Includes Includes `json:"includes"`
	// Family is "ipv6" for a row whose server address is IPv6 (its ratios
	// in the table are to host-raw-ipv6), empty for IPv4; RRTool measured
	// its RR (rr.go).
	Family string `json:"family,omitempty"`
	RRTool string `json:"rr_tool"`
	// Per repetition (null: that measurement failed), in the order measured.
	Reps Reps `json:"reps"`
	// CPSConns and CPSErrors total the connections made and failed.
	CPSConns  int64 `json:"cps_conns"`
	CPSErrors int64 `json:"cps_errors"`
	// CPSErrorKinds counts the failed connections by cause.
	CPSErrorKinds map[string]int64 `json:"cps_error_kinds,omitempty"`
	// BPFNsPerConn: what every BPF program on the machine ran per
	// connection during the conn/s runs (Options.BPFCost), with each
	// program name's median share; nil when not measured.
	BPFNsPerConn *Summary         `json:"bpf_ns_per_conn,omitempty"`
	BPFPrograms  []BPFProgramCost `json:"bpf_programs,omitempty"`
	// BPFNsPerRR and BPFProgramsRR: the same per round trip of the RR runs
	// (sockperf rows).
	BPFNsPerRR    *Summary         `json:"bpf_ns_per_rr,omitempty"`
	BPFProgramsRR []BPFProgramCost `json:"bpf_programs_rr,omitempty"`
	// Policies: measured with this many NetworkPolicies selecting the pods
	// (policy rows only); PolicyBase groups a row with its zero-policy twin.
	Policies   *int   `json:"policies,omitempty"`
	PolicyBase string `json:"policy_base,omitempty"`
	// Paired holds, per reference row, the spread of this row's
	// per-repetition ratios to it (both measured back to back in the same
	// repetition).
	Paired map[string]PairedRatios `json:"paired_ratios,omitempty"`
}

// BPFProgramCost is one program name's median run time and runs per
// connection over the repetitions (programs of one name summed: one per
// node or device).
type BPFProgramCost struct {
	Name        string  `json:"name"`
	NsPerConn   float64 `json:"ns_per_conn"`
	RunsPerConn float64 `json:"runs_per_conn"`
}

// HostCPU is a guest row's host CPU at fixed loads: ns per byte of TCP
// to and from the guest at TCPMbps, µs per RR transaction (closed loop).
type HostCPU struct {
	TCPMbps      int     `json:"tcp_mbps"`
	NsPerByte    Summary `json:"ns_per_byte"`
	NsPerByteRev Summary `json:"ns_per_byte_rev"`
	UsPerTxn     Summary `json:"us_per_txn"`
	// Guest NIC interrupts in the same runs, read in the guest: per MB to
	// and from the guest, per transaction (guestirq.go).
	IRQPerMB    Summary `json:"guest_irq_per_mb,omitzero"`
	IRQPerMBRev Summary `json:"guest_irq_per_mb_rev,omitzero"`
	IRQPerTxn   Summary `json:"guest_irq_per_txn,omitzero"`
	// Parts: the same for single processes of the row (the backend, QEMU
	// without its vCPUs); the rest is the kernel (softirq, the path between
	// the client and the guest), the client and other work on the machine.
	Parts           []HostCPUPart `json:"parts,omitempty"`
	MachineWideNote string        `json:"note"`
}

// HostCPUPart is one process's share of a row's HostCPU.
type HostCPUPart struct {
	Name         string  `json:"name"`
	NsPerByte    Summary `json:"ns_per_byte"`
	NsPerByteRev Summary `json:"ns_per_byte_rev"`
	UsPerTxn     Summary `json:"us_per_txn"`
}

// hostCPUNote says what the host CPU figures include.
const hostCPUNote = "machine-wide busy CPU (wall time minus idle, /proc/stat) minus every guest's vCPU threads: backend, QEMU main loop and I/O, client, softirq; meaningful on a quiet machine only"

// Reps are a row's raw values per repetition.
type Reps struct {
	TCPGbps []*float64 `json:"tcp_gbps"`
	// Guest rows: TCP from the guest and the host CPU metrics.
	TCPRevGbps      []*float64 `json:"tcp_rev_gbps,omitempty"`
	CPUNsPerByte    []*float64 `json:"cpu_ns_per_byte,omitempty"`
	CPUNsPerByteRev []*float64 `json:"cpu_ns_per_byte_rev,omitempty"`
	CPUUsPerTxn     []*float64 `json:"cpu_us_per_txn,omitempty"`
	RRP50us         []*float64 `json:"rr_p50_us"`
	RRP99us         []*float64 `json:"rr_p99_us"`
	CPS             []*float64 `json:"cps"`
	CPSErrors       []*float64 `json:"cps_errors"`
}

// PairedRatios are min/median/max of per-repetition ratios; nil when no
// repetition has both values.
type PairedRatios struct {
	TCPGbps *Summary `json:"tcp_gbps"`
	RRP50us *Summary `json:"rr_p50_us"`
	RRP99us *Summary `json:"rr_p99_us"`
	CPS     *Summary `json:"cps"`
}

// Ratios are a row's medians divided by the host row's medians; a metric
// whose host value is missing is null.
type Ratios struct {
	TCPGbps *float64 `json:"tcp_gbps"`
	RRP50us *float64 `json:"rr_p50_us"`
	RRP99us *float64 `json:"rr_p99_us"`
	CPS     *float64 `json:"cps"`
}

// Machine describes where the numbers were measured.
type Machine struct {
	Kernel   string `json:"kernel"`
	CPUModel string `json:"cpu_model"`
	Cores    int    `json:"cores"`
}

// HostPath is the node-to-node row with the node's netfilter rules and
// conntrack; RawPath the node-to-node physical limit with neither.
const (
	HostPath = "host"
	RawPath  = "host-raw"
	// RawPath6 is RawPath over IPv6: the reference of the IPv6 rows.
	RawPath6 = "host-raw-ipv6"
	// FamilyIPv6 is Row.Family of an IPv6 row.
	FamilyIPv6 = "ipv6"
)

func buildReport(paths []Path, all []samples, o Options) *Report {
	r := &Report{Machine: DescribeMachine(), Repeat: o.Repeat, DurationS: o.Duration.Seconds()}
	for i, p := range paths {
		s := all[i]
		p50, p99, cps := Summarize(s.p50), Summarize(s.p99), Summarize(s.cps)
		server := "netns"
		var rev *Summary
		var hc *HostCPU
		var guestReps Reps
		if p.Guest != nil {
			server = "guest:" + p.Guest.Name
			r := Summarize(s.gbpsRev)
			rev = &r
			guestReps.TCPRevGbps = reps(s.gbpsRev)
			if hostCPURow(p) && len(o.GuestPIDs) > 0 {
				hc = &HostCPU{TCPMbps: o.cpuTCPMbps(), MachineWideNote: hostCPUNote,
					NsPerByte: Summarize(s.cpuByte), NsPerByteRev: Summarize(s.cpuByteRev), UsPerTxn: Summarize(s.cpuTxn),
					IRQPerMB: Summarize(s.irqMB), IRQPerMBRev: Summarize(s.irqMBRev), IRQPerTxn: Summarize(s.irqTxn)}
				for _, part := range p.CPUParts {
					sum := func(m map[string][]float64) Summary {
						if xs, ok := m[part.Name]; ok {
							return Summarize(xs)
						}
						return Summary{}
					}
					hc.Parts = append(hc.Parts, HostCPUPart{Name: part.Name, NsPerByte: sum(s.cpuPartByte),
						NsPerByteRev: sum(s.cpuPartByteRev), UsPerTxn: sum(s.cpuPartTxn)})
				}
				guestReps.CPUNsPerByte, guestReps.CPUNsPerByteRev = reps(s.cpuByte), reps(s.cpuByteRev)
				guestReps.CPUUsPerTxn = reps(s.cpuTxn)
			}
		}
		bpfTotal, bpfProgs := bpfCostOf(&s.bpfConn)
		bpfRR, bpfProgsRR := bpfCostOf(&s.bpfRR)
		r.Rows = append(r.Rows, Row{
			BPFNsPerConn: bpfTotal, BPFPrograms: bpfProgs, BPFNsPerRR: bpfRR, BPFProgramsRR: bpfProgsRR,
			Path: p.Name, ClientNS: p.ClientNS, ServerNS: p.ServerNS, ServerIP: p.ServerIP,
			Server: server, Note: p.Note, GuestOffloads: s.offloads,
			TCPGbps: Summarize(s.gbps), TCPRevGbps: rev, HostCPU: hc,
			RRP50us: p50.Median, RRP50Range: p50,
			RRP99us: p99.Median, RRP99Range: p99,
			CPS: cps.Median, CPSRange: cps,
			Errors:   s.errs,
			Includes: p.Includes,
			Reps: Reps{TCPGbps: reps(s.gbps), RRP50us: reps(s.p50), RRP99us: reps(s.p99),
				CPS: reps(s.cps), CPSErrors: reps(s.cpsErrs), TCPRevGbps: guestReps.TCPRevGbps,
				CPUNsPerByte: guestReps.CPUNsPerByte, CPUNsPerByteRev: guestReps.CPUNsPerByteRev,
				CPUUsPerTxn: guestReps.CPUUsPerTxn},
			CPSConns: int64(sum(s.cpsConns)), CPSErrors: int64(sum(s.cpsErrs)), CPSErrorKinds: s.cpsKinds,
			Policies: p.Policies, PolicyBase: p.PolicyBase,
			RRTool: rrTool(p), Family: pathFamily(p),
		})
	}
	r.BusyCPUs = o.BusyCPUs
	r.ComputeRatios()
	return r
}

// bpfCostOf summarizes a row's BPF run time per unit: nil when no
// repetition measured it; programs by median cost, highest first.
func bpfCostOf(s *bpfSamples) (*Summary, []BPFProgramCost) {
	if !slices.ContainsFunc(s.total, func(x float64) bool { return !math.IsNaN(x) }) {
		return nil, nil
	}
	total := Summarize(s.total)
	med := map[string]float64{}
	measured := func(xs []float64) []float64 { // a program that did not run in a measured repetition ran 0 ns
		out := slices.Clone(xs)
		for i := range out {
			if math.IsNaN(out[i]) && !math.IsNaN(s.total[i]) {
				out[i] = 0
			}
		}
		return out
	}
	for name, xs := range s.byName {
		med[name] = Summarize(measured(xs)).Median
	}
	var progs []BPFProgramCost
	for _, name := range topPrograms(med, len(med)) {
		progs = append(progs, BPFProgramCost{Name: name, NsPerConn: med[name], RunsPerConn: Summarize(measured(s.runsByName[name])).Median})
	}
	return &total, progs
}

func reps(xs []float64) []*float64 {
	out := make([]*float64, len(xs))
	for i, x := range xs {
		if !math.IsNaN(x) {
			out[i] = &x
		}
	}
	return out
}

func sum(xs []float64) float64 {
	t := 0.0
	for _, x := range xs {
		if !math.IsNaN(x) {
			t += x
		}
	}
	return t
}

// ComputeRatios fills RatioToHost (ratio of medians) of every row from the
// host row, the paired ratios to host and host-raw, and the targets.
func (r *Report) ComputeRatios() {
	r.computePaired()
	r.Targets = checkTargets(r)
	if r.Services != nil {
		r.Services.Compute()
	}
	if r.BigTCP != nil {
		r.BigTCP.Compute()
	}
	var host *Row
	for i := range r.Rows {
		if r.Rows[i].Path == HostPath {
			host = &r.Rows[i]
		}
	}
	if host == nil {
		return
	}
	ratio := func(a, b float64) *float64 {
		if a == 0 || b == 0 {
			return nil
		}
		v := Ratio(a, b)
		return &v
	}
	for i := range r.Rows {
		row := &r.Rows[i]
		row.RatioToHost = &Ratios{
			TCPGbps: ratio(row.TCPGbps.Median, host.TCPGbps.Median),
			RRP50us: ratio(row.RRP50us, host.RRP50us),
			RRP99us: ratio(row.RRP99us, host.RRP99us),
			CPS:     ratio(row.CPS, host.CPS),
		}
	}
}

// WriteJSON writes the report as exactly one JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("encode bench report: %w", err)
	}
	return nil
}

// WriteTable prints medians with (min–max) and the ratio to host per metric.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "machine: %s, %d cores, kernel %s; %d × %gs per metric, paths interleaved\n",
		r.Machine.CPUModel, r.Machine.Cores, r.Machine.Kernel, r.Repeat, r.DurationS)
	if len(r.Rows) > 0 {
		if err := r.writeRows(w); err != nil {
			return err
		}
	}
	if r.VMBackend != nil {
		if err := r.VMBackend.WriteTable(w); err != nil {
			return err
		}
	}
	if r.Services != nil {
		if err := r.Services.WriteTable(w); err != nil {
			return err
		}
	}
	if r.BigTCP != nil {
		if err := r.BigTCP.WriteTable(w); err != nil {
			return err
		}
	}
	return nil
}

// writeRows prints the paths table (medians with min–max, and the paired
// ratios to the reference row), the labels, the targets, notes and errors.
func (r *Report) writeRows(w io.Writer) error {
	if r.BusyCPUs {
		fmt.Fprintln(w, "RR measured with every CPU kept busy (SCHED_IDLE spinners): no idle-exit latency")
	} else {
		fmt.Fprintln(w, "RR measured with idle CPUs (latencies include idle-exit; --busy-cpus avoids it)")
	}
	ref := r.reference()
	x := "×" + ref
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "path\tTCP Gbit/s\t%s\tRR p50 µs\t%s\tRR p99 µs\t%s\tconn/s\t%s\tconn errors\tincludes\t\n", x, x, x, x)
	for _, row := range r.Rows {
		var pr PairedRatios
		if rr := r.rowReference(row, ref); rr != "" {
			pr = row.Paired[rr]
		}
		name := row.Path
		if row.Note != "" {
			name += " *"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t\n", name,
			spread(row.TCPGbps, "%.2f"), pairedText(pr.TCPGbps),
			spread(row.RRP50Range, "%.1f"), pairedText(pr.RRP50us),
			spread(row.RRP99Range, "%.1f"), pairedText(pr.RRP99us),
			spread(row.CPSRange, "%.0f"), pairedText(pr.CPS), row.CPSErrors, includesText(row.Includes))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write bench table: %w", err)
	}
	if ref != "" {
		fmt.Fprintf(w, "%s: median (min–max) over repetitions of the per-repetition ratio to %s (both measured back to back)\n", x, ref)
	}
	if r.row(RawPath6) != nil {
		fmt.Fprintf(w, "IPv6 rows (-ipv6): ratios to %s; their RR is measured by %s (sockperf 3.7 takes IPv4 only), so compare RR only within a family\n", RawPath6, RRToolGo)
	}
	for _, row := range r.Rows {
		if row.TCPRevGbps != nil {
			fmt.Fprintf(w, "TCP from the guest (%s -> client, iperf3 -R): %s Gbit/s\n", row.Path, spread(*row.TCPRevGbps, "%.2f"))
		}
	}
	for _, row := range r.Rows {
		if row.GuestOffloads != "" {
			fmt.Fprintf(w, "virtio offloads negotiated (%s, read in the guest): %s\n", row.Path, row.GuestOffloads)
		}
	}
	r.writeHostCPU(w)
	r.writeBPFCost(w)
	for _, row := range r.Rows {
		if row.Includes.Detail != "" {
			fmt.Fprintf(w, "includes: %s: %s\n", row.Path, row.Includes.Detail)
		}
	}
	for _, t := range r.Targets {
		fmt.Fprintf(w, "target: %s\n", t)
	}
	for _, row := range r.Rows {
		if row.CPSErrors > 0 {
			fmt.Fprintf(w, "conn errors: %s: %d of %d attempts (%s); conn/s counts completed connections only\n",
				row.Path, row.CPSErrors, row.CPSErrors+row.CPSConns, kindsText(row.CPSErrorKinds))
		}
	}
	for _, row := range r.Rows {
		if row.Note != "" {
			fmt.Fprintf(w, "* %s: %s\n", row.Path, row.Note)
		}
	}
	for _, row := range r.Rows {
		for _, e := range row.Errors {
			fmt.Fprintf(w, "error: %s: %s\n", row.Path, e)
		}
	}
	return nil
}

// reference is the row the table compares with: host-raw when measured,
// else host.
func (r *Report) reference() string {
	for _, want := range []string{RawPath, HostPath} {
		for _, row := range r.Rows {
			if row.Path == want {
				return want
			}
		}
	}
	return ""
}

// kindsText lists error causes, most frequent first.
func kindsText(kinds map[string]int64) string {
	keys := make([]string, 0, len(kinds))
	for k := range kinds {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if kinds[keys[i]] != kinds[keys[j]] {
			return kinds[keys[i]] > kinds[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d × %s", kinds[k], k)
	}
	if len(parts) == 0 {
		return "causes not reported"
	}
	return strings.Join(parts, ", ")
}

func pairedText(s *Summary) string {
	if s == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f (%.2f–%.2f)", s.Median, s.Min, s.Max)
}

// includesText renders a row's label: what its traffic pays for ("none":
// the bare link).
func includesText(in Includes) string {
	var parts []string
	for _, f := range []struct {
		on   bool
		what string
	}{{in.BPF, "BPF"}, {in.Netfilter, "netfilter"}, {in.Conntrack, "conntrack"}} {
		if f.on {
			parts = append(parts, f.what)
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "+")
}

func scaled(s Summary, k float64) Summary {
	return Summary{Min: s.Min * k, Median: s.Median * k, Max: s.Max * k}
}

// Failed reports whether any measurement failed.
func (r *Report) Failed() bool {
	for _, row := range r.Rows {
		if len(row.Errors) > 0 {
			return true
		}
	}
	return (r.VMBackend != nil && len(r.VMBackend.Errors) > 0) || (r.Services != nil && r.Services.Failed()) ||
		(r.BigTCP != nil && r.BigTCP.Failed())
}

func spread(s Summary, f string) string {
	if s == (Summary{}) {
		return "-"
	}
	return fmt.Sprintf(f+" ("+f+"–"+f+")", s.Median, s.Min, s.Max)
}

// DescribeMachine reads the kernel release, CPU model and core count.
func DescribeMachine() Machine {
	m := Machine{Cores: runtime.NumCPU(), CPUModel: "unknown", Kernel: "unknown"}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		if model := cpuModel(data); model != "" {
			m.CPUModel = model
		}
	}
	return m
}

// cpuModel returns the first "model name" of a /proc/cpuinfo text.
func cpuModel(cpuinfo []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(cpuinfo))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// svcRepeat is the services section's repetitions (0 without one).
func (r *Report) svcRepeat() int {
	if r.Services == nil {
		return 0
	}
	return r.Services.Repeat
}
