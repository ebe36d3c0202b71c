package bench

import (
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
)

// BackendReport is the "vm_backend" object of the bench JSON. PPS64 and
// Gbps1500 are guest→wire with lanekit-vhost's own sockets (--ifname); the
// real-path rows feed lanekit-vhost the sockets the bench made as lanekitd
// does (steer_vm, lk_xsks, fd handover).
type BackendReport struct {
	PPS64    BackendMetric `json:"pps_64"`
	Gbps1500 BackendMetric `json:"gbps_1500"`
	// GuestToWireReal: its testpmd column is the same testpmd measurement as
	// the own-socket row's (testpmd has no agent path).
	GuestToWireReal *BackendDirection `json:"guest_to_wire_real,omitempty"`
	// WireToGuestReal: a generator on the wire side, counted by the frontend
	// (rxonly); testpmd forwards af_xdp -> vhost from the same generator.
	WireToGuestReal *BackendDirection `json:"wire_to_guest_real,omitempty"`
	PathCheck       *BackendPathCheck `json:"path_check,omitempty"`
	// Steering: flows into a multiqueue VM with and without the guest's
	// RSS configuration (vmsteer.go).
	Steering *SteerReport `json:"steering,omitempty"`
	// CPU: backend CPU time per frame at a fixed offered load
	// (vmbackend_cpu.go).
	CPU *BackendCPU `json:"cpu_per_frame,omitempty"`
	// TimeSplit: the backends' user/kernel time in the guest→wire
	// saturation runs (where the time goes).
	TimeSplit []BackendTimeSplit `json:"time_split,omitempty"`
	// Targets: issue 29's goals against this run's ratios.
	Targets []BackendTarget `json:"targets,omitempty"`
	// LoadAvg: /proc/loadavg's 1-minute figure when the comparison started
	// and ended (the machine is shared: these ratios need quiet cores; 0:
	// unreadable).
	LoadAvg [2]float64 `json:"loadavg_1m"`
	Repeat  int        `json:"repeat"`
	Seconds float64    `json:"seconds"`
	Setup   string     `json:"setup"`
	Errors  []string   `json:"errors,omitempty"`
}

// BackendDirection is one direction's two metrics.
type BackendDirection struct {
	PPS64    BackendMetric `json:"pps_64"`
	Gbps1500 BackendMetric `json:"gbps_1500"`
}

// BackendMetric compares lanekit-vhost with testpmd on one metric; Ratio is
// the median of lanekit-vhost over the median of testpmd (null when unknown).
type BackendMetric struct {
	LanekitVhost Summary  `json:"lanekit_vhost"`
	Testpmd      Summary  `json:"testpmd"`
	Ratio        *float64 `json:"ratio"`
}

// BackendPathCheck is the evidence that the real-path rows took the agent's
// path: the program on the VM device, the socket handovers served, steer_vm's
// per-endpoint drop counters seeing a probe, and the frames lanekit-vhost
// took from the agent's sockets.
type BackendPathCheck struct {
	VMDevice   string `json:"vm_device"`
	XDPProgram string `json:"xdp_program"` // attached to VMDevice, read back from the kernel
	Handovers  int64  `json:"handovers"`   // socket sets handed to lanekit-vhost
	// ProbeSent unicast frames for a foreign MAC were sent from the wire side;
	// ProbeCounted is the VM endpoint's not-for-vm drop counter afterwards.
	ProbeSent    uint64 `json:"not_for_vm_probe_sent"`
	ProbeCounted uint64 `json:"not_for_vm_probe_counted"`
	// BackendRxFrames: lanekit_vhost_rx_packets_total (frames from the
	// agent's sockets into the guest) summed over the wire→guest runs.
	BackendRxFrames uint64 `json:"backend_rx_frames"`
	// GuestRxFrames: what the frontend counted in those runs' windows (a
	// part of BackendRxFrames: lanekit-vhost's only port is the agent's).
	GuestRxFrames uint64 `json:"guest_rx_frames"`
	// SteerDrops: the VM endpoint's drops by reason at the end (probe included).
	SteerDrops map[string]uint64 `json:"steer_drops,omitempty"`
}

// backendValues are per-kind, per-frame-size measurements (Mpps for 64 B as
// frames/s, Gbit/s for 1500 B).
type backendValues map[string]map[int][]float64

func (v backendValues) add(kind string, size int, x float64) {
	if v[kind] == nil {
		v[kind] = map[int][]float64{}
	}
	v[kind][size] = append(v[kind][size], x)
}

// fill sets the report's metrics from vals; real-path rows only when the
// real path was part of the run.
func (r *BackendReport) fill(vals backendValues, real bool) {
	dir := func(lk, tp string) BackendDirection {
		return BackendDirection{
			PPS64:    backendMetric(vals[lk][64], vals[tp][64]),
			Gbps1500: backendMetric(vals[lk][frameSize1500], vals[tp][frameSize1500]),
		}
	}
	own := dir(kindOwn, kindTestpmd)
	r.PPS64, r.Gbps1500 = own.PPS64, own.Gbps1500
	if real {
		tx, rx := dir(kindRealTX, kindTestpmd), dir(kindRealRX, kindTestpmdRX)
		r.GuestToWireReal, r.WireToGuestReal = &tx, &rx
	}
}

func backendMetric(lk, tp []float64) BackendMetric {
	m := BackendMetric{LanekitVhost: Summarize(lk), Testpmd: Summarize(tp)}
	if m.LanekitVhost.Median > 0 && m.Testpmd.Median > 0 {
		r := Ratio(m.LanekitVhost.Median, m.Testpmd.Median)
		m.Ratio = &r
	}
	return m
}

// WriteTable prints the backend comparison as a small table of its own.
func (b *BackendReport) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "\nVM backend (%d × %gs, interleaved; load average %.1f → %.1f; %s)\n", b.Repeat, b.Seconds, b.LoadAvg[0], b.LoadAvg[1], b.Setup)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "direction\tsockets\tmetric\tlanekit-vhost\ttestpmd vhost+af_xdp\tratio\t")
	rows := []struct {
		dir, socks string
		d          *BackendDirection
	}{
		{"guest→wire", "own (--ifname)", &BackendDirection{PPS64: b.PPS64, Gbps1500: b.Gbps1500}},
		{"guest→wire", "agent (steer_vm)", b.GuestToWireReal},
		{"wire→guest", "agent (steer_vm)", b.WireToGuestReal},
	}
	for _, r := range rows {
		if r.d == nil {
			continue
		}
		for _, m := range []struct {
			name, f string
			scale   float64
			v       BackendMetric
		}{
			{"64 B Mpps", "%.3f", 1e-6, r.d.PPS64},
			{"1500 B Gbit/s", "%.2f", 1, r.d.Gbps1500},
		} {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", r.dir, r.socks, m.name, spread(scaled(m.v.LanekitVhost, m.scale), m.f),
				spread(scaled(m.v.Testpmd, m.scale), m.f), backendRatio(m.v.Ratio))
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write vm backend table: %w", err)
	}
	for _, t := range b.TimeSplit {
		fmt.Fprintf(w, "guest→wire %4d B %-20s backend %.0f%% of a core, %.1f%% of it user space (%.1f–%.1f), the rest kernel\n", t.Size, t.Kind,
			100*t.CPUShare.Median, 100*t.UserShare.Median, 100*t.UserShare.Min, 100*t.UserShare.Max)
	}
	if c := b.CPU; c != nil {
		if err := c.WriteTable(w); err != nil {
			return err
		}
	}
	if len(b.Targets) > 0 {
		fmt.Fprintln(w, "\ntargets:")
		for _, t := range b.Targets {
			fmt.Fprintf(w, "  %s\n", t)
		}
	}
	if c := b.PathCheck; c != nil {
		fmt.Fprintf(w, "agent path: XDP program %q on %s, %d socket handover(s), %d/%d not-for-vm probes counted by the VM endpoint, "+
			"%d frames from agent sockets into the guest (%d counted by it in the windows)%s\n", c.XDPProgram, c.VMDevice, c.Handovers,
			c.ProbeCounted, c.ProbeSent, c.BackendRxFrames, c.GuestRxFrames, formatDrops(c.SteerDrops))
	}
	if st := b.Steering; st != nil {
		if err := st.WriteTable(w); err != nil {
			return err
		}
	}
	for _, e := range b.Errors {
		fmt.Fprintf(w, "error: vm backend: %s\n", e)
	}
	return nil
}

// WriteTable prints the steering runs.
func (st *SteerReport) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "\nVM receive steering: %d flows into %d queues, %d B (%s)\n", st.Flows, st.Queues, st.Size, st.Setup)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "steering\tframes/queue\tmax/min\tflows on 2+ queues\tMpps into guest\thash = reference\ton table's queue\t")
	for _, r := range st.Runs {
		bal := "-"
		if r.Balance > 0 {
			bal = fmt.Sprintf("%.2f", r.Balance)
		}
		check := func(n int) string {
			if r.Mode != "guest-rss" {
				return "-"
			}
			return fmt.Sprintf("%d/%d", n, st.Flows)
		}
		fmt.Fprintf(tw, "%s\t%v\t%s\t%d\t%.3f\t%s\t%s\t\n", r.Mode, r.PerQueue, bal, r.Split, r.Mpps, check(r.HashOK), check(r.QueueOK))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write steering table: %w", err)
	}
	return nil
}

func formatDrops(d map[string]uint64) string {
	if len(d) == 0 {
		return ""
	}
	var parts []string
	for k, v := range d {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return "; steer_vm drops: " + strings.Join(parts, " ")
}

// backendRatio formats a ratio for the backend table ("-" when unknown).
func backendRatio(r *float64) string {
	if r == nil || math.IsNaN(*r) {
		return "-"
	}
	return fmt.Sprintf("%.2f×", *r)
}

// BackendTarget is one goal and where this run stands (Ratio nil: not
// measured).
type BackendTarget struct {
	Name  string   `json:"name"`
	Op    string   `json:"op"` // ">=" or "<="
	Want  float64  `json:"want"`
	Ratio *float64 `json:"ratio"`
	Met   bool     `json:"met"`
	// Where: for a missed throughput target, where both backends' core
	// time went (from TimeSplit).
	Where string `json:"where,omitempty"`
	// Contended: the backends did not have their core to themselves (a
	// saturated backend or busy-polling testpmd below 90% of a core): the
	// ratio is not a verdict. Why says who got how much.
	Contended bool   `json:"contended"`
	Why       string `json:"contended_why,omitempty"`
}

func (t BackendTarget) String() string {
	s := t.verdict()
	if t.Contended {
		s += " [CONTENDED, not a verdict: " + t.Why + "]"
	}
	return s
}

func (t BackendTarget) verdict() string {
	sym := map[string]string{">=": "≥", "<=": "≤"}[t.Op]
	if t.Ratio == nil {
		return fmt.Sprintf("%-34s %s %.2f×: not measured", t.Name, sym, t.Want)
	}
	r := *t.Ratio
	if t.Met {
		return fmt.Sprintf("%-34s %s %.2f×: met (%.2f×)", t.Name, sym, t.Want, r)
	}
	if t.Op == ">=" {
		s := fmt.Sprintf("%-34s %s %.2f×: missed, %.2f× (lanekit-vhost needs %+.1f%%)", t.Name, sym, t.Want, r, 100*(t.Want/r-1))
		if t.Where != "" {
			s += "; " + t.Where
		}
		return s
	}
	return fmt.Sprintf("%-34s %s %.2f×: missed, %.2f× (lanekit-vhost's CPU per frame needs %.1f%%)", t.Name, sym, t.Want, r, 100*(t.Want/r-1))
}

// backendTargets checks the run against issue 29: guest→wire throughput
// ≥ 1.05× testpmd at 64 B and 1500 B (own sockets), CPU per frame ≤ 0.9×
// testpmd's in both directions.
func backendTargets(r *BackendReport) []BackendTarget {
	ts := []BackendTarget{
		{Name: "guest→wire 64 B Mpps", Op: ">=", Want: 1.05, Ratio: r.PPS64.Ratio},
		{Name: "guest→wire 1500 B Gbit/s", Op: ">=", Want: 1.05, Ratio: r.Gbps1500.Ratio},
	}
	if r.CPU != nil {
		ratio := func(d *CPUDirection) *float64 {
			if d == nil {
				return nil
			}
			return d.Ratio
		}
		ts = append(ts,
			BackendTarget{Name: "guest→wire CPU per frame", Op: "<=", Want: 0.9, Ratio: ratio(r.CPU.GuestToWire)},
			BackendTarget{Name: "wire→guest CPU per frame", Op: "<=", Want: 0.9, Ratio: ratio(r.CPU.WireToGuest)})
	}
	ts[0].Where, ts[1].Where = r.where(64), r.where(frameSize1500)
	ts[0].Why, ts[1].Why = r.contention(64), r.contention(frameSize1500)
	if r.CPU != nil {
		ts[2].Why, ts[3].Why = cpuContention(r.CPU.GuestToWire), cpuContention(r.CPU.WireToGuest)
	}
	for i := range ts {
		ts[i].Contended = ts[i].Why != ""
		if x := ts[i].Ratio; x != nil && !math.IsNaN(*x) {
			ts[i].Met = (ts[i].Op == ">=" && *x >= ts[i].Want) || (ts[i].Op == "<=" && *x <= ts[i].Want)
		} else {
			ts[i].Ratio = nil
		}
	}
	return ts
}

// fullCore: a saturated backend (or busy-polling testpmd) that got less
// of its core than this shared it.
const fullCore = 0.9

// contention says which guest→wire saturation runs of size bytes had less
// than their core ("" if none, or unknown).
func (r *BackendReport) contention(size int) string {
	var why []string
	for _, t := range r.TimeSplit {
		if t.Size == size && (t.Kind == kindOwn || t.Kind == kindTestpmd) && t.CPUShare.Median < fullCore {
			why = append(why, fmt.Sprintf("%s got %.0f%% of its core", t.Kind, 100*t.CPUShare.Median))
		}
	}
	return strings.Join(why, ", ")
}

// cpuContention: testpmd polls without pause, so less than its core means
// it was preempted, and its busy time (wall clock) then holds other
// processes' time.
func cpuContention(d *CPUDirection) string {
	if d == nil || d.Testpmd.CPUShare.Median == 0 || d.Testpmd.CPUShare.Median >= fullCore {
		return ""
	}
	return fmt.Sprintf("busy-polling testpmd got %.0f%% of its core", 100*d.Testpmd.CPUShare.Median)
}

// where says how the backends' core time split between their own code and
// the kernel in the size-byte guest→wire saturation runs ("" if unknown).
func (r *BackendReport) where(size int) string {
	find := func(kind string) *BackendTimeSplit {
		for i := range r.TimeSplit {
			if r.TimeSplit[i].Kind == kind && r.TimeSplit[i].Size == size {
				return &r.TimeSplit[i]
			}
		}
		return nil
	}
	lk, tp := find(kindOwn), find(kindTestpmd)
	if lk == nil || tp == nil {
		return ""
	}
	return fmt.Sprintf("time: lanekit-vhost %.0f%% of a core, %.1f%% of it in its own code, %.1f%% in the kernel (AF_XDP copy-mode "+
		"transmit, the veth peer's receive); testpmd %.0f%%, %.1f%% own code: even free user-space work would gain lanekit-vhost at most %+.1f%%",
		100*lk.CPUShare.Median, 100*lk.UserShare.Median, 100*(1-lk.UserShare.Median), 100*tp.CPUShare.Median, 100*tp.UserShare.Median,
		100*(1/(1-lk.UserShare.Median)-1))
}

// WriteTable prints the CPU-per-frame comparison.
func (c *BackendCPU) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "\nVM backend CPU per frame at a fixed load (%s)\n", c.Setup)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "direction\tbackend\tdelivered kpps\tdelivered %\tprocess CPU %\tprocess ns/frame\tbusy ns/frame\tratio busy\tratio process\tratio conservative\t")
	for _, d := range []struct {
		name string
		d    *CPUDirection
	}{{"guest→wire", c.GuestToWire}, {"wire→guest", c.WireToGuest}} {
		if d.d == nil {
			continue
		}
		for i, s := range []struct {
			name string
			side CPUSide
		}{{"lanekit-vhost", d.d.LanekitVhost}, {"testpmd", d.d.Testpmd}} {
			ratios := "\t\t"
			if i == 0 {
				ratios = backendRatio(d.d.Ratio) + "\t" + backendRatio(d.d.ProcessRatio) + "\t" + backendRatio(d.d.ConservativeRatio)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", d.name, s.name, spread(scaled(s.side.DeliveredPPS, 1e-3), "%.1f"),
				spread(scaled(s.side.DeliveredShare, 100), "%.1f"), spread(scaled(s.side.CPUShare, 100), "%.1f"),
				spread(s.side.NsPerFrame, "%.0f"), spread(s.side.BusyNsPerFrame, "%.0f"), ratios)
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write cpu table: %w", err)
	}
	fmt.Fprintln(w, "ratio busy: busy ns/frame, same accounting both sides (the target's ratio; testpmd's per frame it received); "+
		"ratio process: process CPU per delivered frame (testpmd's includes its idle polling); "+
		"ratio conservative: lanekit-vhost process / testpmd busy (lanekit-vhost's wakeups in, testpmd's polling out)")
	return nil
}

// LoadAvg1 reads the 1-minute load average (0 if unreadable).
func LoadAvg1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	return parseLoadAvg(string(b))
}

func parseLoadAvg(s string) float64 {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0
	}
	return v
}
