package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"text/tabwriter"
	"time"
)

// The BIG TCP section (`lab bench --big-tcp`, issue 42): TCP between
// lanekit pods with BIG TCP as the agents set it and with it off, the two
// interleaved within every repetition, so a paired on/off ratio compares
// measurements taken moments apart. "Off" gives the devices the rows cross
// the kernel's 64 KiB GSO/GRO sizes (pkg/lab's switch); each measurement
// also reads the sending pod's from-pod counters, whose bytes per packet
// show which sizes actually crossed the datapath.

// BigTCPLegacySize is the GSO/GRO limit without BIG TCP (64 KiB): a from-pod
// average above it proves BIG TCP packets crossed the datapath.
const BigTCPLegacySize = 65536

// BigTCPCase is one BIG TCP row: Streams parallel TCP connections (iperf3
// -P) along Path, between two pods on one node or on two.
type BigTCPCase struct {
	Placement string // "same-node" or "cross-node"
	Family    string // "ipv4" or "ipv6"
	Streams   int
	Path      Path
}

// Name is the row's label, e.g. "lanekit-pod same-node 8 streams ipv6".
// Path.Name ("lanekit-pod") leads it.
func (c BigTCPCase) Name() string {
	unit := "streams"
	if c.Streams == 1 {
		unit = "stream"
	}
	name := fmt.Sprintf("%s %s %d %s", c.Path.Name, c.Placement, c.Streams, unit)
	if c.Family == "ipv6" {
		name += " ipv6"
	}
	return name
}

// BigTCPSwitch turns BIG TCP on (the sizes the agents gave the devices)
// and off (64 KiB) on every device the rows cross, and reads what a row's
// sending pod sent through from_pod.
type BigTCPSwitch interface {
	Set(ctx context.Context, on bool) error
	SenderCounters(ctx context.Context, c BigTCPCase) (packets, bytes uint64, err error)
}

// BigTCPSetup is what the devices held before the run: the families whose
// every device had sizes above 64 KiB (only those are measured), and per
// device its sizes, or why a family was not active.
type BigTCPSetup struct {
	Active  map[string]bool // family -> on
	Detail  string          // e.g. the agent's BIG TCP status line
	Devices []string        // "lk-node1 eth0: gso 196608 gro 196608 gso_ipv4 ... gro_ipv4 ..."
	Why     []string        // why a family is not measured
}

// BigTCPReport is the BIG TCP section of a bench report.
type BigTCPReport struct {
	Repeat  int         `json:"repeat"`
	Detail  string      `json:"detail,omitempty"`
	Devices []string    `json:"devices"`
	Skipped []string    `json:"skipped,omitempty"`
	Rows    []BigTCPRow `json:"rows"`
}

// BigTCPRow is one case measured with BIG TCP on and off.
type BigTCPRow struct {
	Name      string `json:"name"`
	Placement string `json:"placement"`
	Family    string `json:"family"`
	Streams   int    `json:"streams"`
	ClientNS  string `json:"client_netns"`
	ServerNS  string `json:"server_netns"`
	ServerIP  string `json:"server_ip"`
	// Computed from Reps (Compute).
	OnGbps  Summary  `json:"on_gbps"`
	OffGbps Summary  `json:"off_gbps"`
	Ratio   *Summary `json:"on_off_ratio,omitempty"` // paired on/off per repetition
	// The sending pod's from-pod bytes per packet during the measurements.
	OnBytesPerPacket  Summary `json:"on_bytes_per_packet"`
	OffBytesPerPacket Summary `json:"off_bytes_per_packet"`
	// Verified: every "on" measurement averaged more than 64 KiB per packet
	// through from_pod and every "off" one at most 64 KiB.
	Verified bool       `json:"verified"`
	Reps     BigTCPReps `json:"reps"`
	Errors   []string   `json:"errors,omitempty"`
}

// BigTCPReps are a row's values per repetition (null: failed).
type BigTCPReps struct {
	OnGbps            []*float64 `json:"on_gbps"`
	OffGbps           []*float64 `json:"off_gbps"`
	OnBytesPerPacket  []*float64 `json:"on_bytes_per_packet"`
	OffBytesPerPacket []*float64 `json:"off_bytes_per_packet"`
}

// bigTCPSamples: per mode (0 on, 1 off) per repetition; NaN: not measured.
type bigTCPSamples struct {
	gbps, bpp [2][]float64
	errs      []string
}

// RunBigTCP measures every case of an active family Repeat times, BIG TCP
// on and off within each repetition (which first alternates), the cases
// from a rotating start. It leaves BIG TCP on (the caller restores the
// devices as found in any case). It fails only on a cancelled context.
func RunBigTCP(ctx context.Context, cases []BigTCPCase, sw BigTCPSwitch, setup BigTCPSetup, o Options) (*BigTCPReport, error) {
	if o.Repeat < 1 {
		o.Repeat = 1
	}
	if o.Duration < time.Second {
		o.Duration = time.Second
	}
	var run []BigTCPCase
	skipped := append([]string(nil), setup.Why...)
	for _, c := range cases {
		if setup.Active[c.Family] {
			run = append(run, c)
		} else {
			skipped = append(skipped, c.Name()+": BIG TCP was not active for "+c.Family)
		}
	}
	all := make([]bigTCPSamples, len(run))
	for i := range all {
		for m := range 2 {
			all[i].gbps[m], all[i].bpp[m] = nanSlice(o.Repeat), nanSlice(o.Repeat)
		}
	}
	for rep := 0; rep < o.Repeat && len(run) > 0; rep++ {
		modes := []bool{true, false}
		if rep%2 == 1 {
			modes = []bool{false, true}
		}
		for _, on := range modes {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("bench: %w", err)
			}
			m := modeIndex(on)
			if err := sw.Set(ctx, on); err != nil {
				for i := range all {
					all[i].errs = append(all[i].errs, fmt.Sprintf("rep %d big tcp %s: %v", rep+1, onOff(on), err))
				}
				continue
			}
			for k := range run {
				i := (k + rep) % len(run)
				if err := ctx.Err(); err != nil {
					return nil, fmt.Errorf("bench: %w", err)
				}
				err := measureBigTCP(ctx, o, sw, run[i], &all[i], m, rep)
				val := fmt.Sprintf("%.2f Gbit/s, %.0f bytes/packet from the pod", all[i].gbps[m][rep], all[i].bpp[m][rep])
				if err != nil {
					all[i].errs = append(all[i].errs, fmt.Sprintf("rep %d big tcp %s: %v", rep+1, onOff(on), err))
					val = "error: " + err.Error()
				}
				o.progress("big-tcp rep %d/%d %-3s %-36s %s", rep+1, o.Repeat, onOff(on), run[i].Name(), val)
			}
		}
	}
	if len(run) > 0 {
		if err := sw.Set(ctx, true); err != nil && ctx.Err() == nil {
			skipped = append(skipped, "turning BIG TCP back on: "+err.Error())
		}
	}
	r := &BigTCPReport{Repeat: o.Repeat, Detail: setup.Detail, Devices: setup.Devices, Skipped: skipped}
	for i, c := range run {
		r.Rows = append(r.Rows, BigTCPRow{Name: c.Name(), Placement: c.Placement, Family: c.Family, Streams: c.Streams,
			ClientNS: c.Path.ClientNS, ServerNS: c.Path.ServerNS, ServerIP: c.Path.ServerIP, Errors: all[i].errs,
			Reps: BigTCPReps{OnGbps: reps(all[i].gbps[0]), OffGbps: reps(all[i].gbps[1]),
				OnBytesPerPacket: reps(all[i].bpp[0]), OffBytesPerPacket: reps(all[i].bpp[1])}})
	}
	r.Compute()
	return r, nil
}

// measureBigTCP runs one iperf3 of c and reads the sender's counters
// around it.
func measureBigTCP(ctx context.Context, o Options, sw BigTCPSwitch, c BigTCPCase, s *bigTCPSamples, m, rep int) error {
	p0, b0, err := sw.SenderCounters(ctx, c)
	if err != nil {
		return err
	}
	var extra []string
	if c.Streams > 1 {
		extra = []string{"-P", strconv.Itoa(c.Streams)}
	}
	srv, args, err := startIperf(ctx, o, c.Path, false, extra...)
	if err != nil {
		return err
	}
	out, err := runIn(ctx, o.Duration+15*time.Second, c.Path.ClientNS, args...)
	srv.stop()
	gbps, perr := ParseIperf3(out)
	if perr != nil {
		return errors.Join(err, perr)
	}
	s.gbps[m][rep] = gbps
	p1, b1, err := sw.SenderCounters(ctx, c)
	if err != nil {
		return err
	}
	if p1 <= p0 || b1 < b0 {
		return fmt.Errorf("the sending pod's from-pod counters did not grow (%d -> %d packets): the stream did not cross the datapath", p0, p1)
	}
	s.bpp[m][rep] = float64(b1-b0) / float64(p1-p0)
	return nil
}

func modeIndex(on bool) int {
	if on {
		return 0
	}
	return 1
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

func nanSlice(n int) []float64 {
	xs := make([]float64, n)
	for i := range xs {
		xs[i] = math.NaN()
	}
	return xs
}

// values turns per-repetition values back into a NaN-marked slice.
func values(ps []*float64) []float64 {
	xs := make([]float64, len(ps))
	for i, p := range ps {
		xs[i] = math.NaN()
		if p != nil {
			xs[i] = *p
		}
	}
	return xs
}

// Compute fills every row's summaries, paired ratio and verdict from its
// per-repetition values (also after loading a saved report).
func (r *BigTCPReport) Compute() {
	for i := range r.Rows {
		row := &r.Rows[i]
		row.OnGbps, row.OffGbps = Summarize(values(row.Reps.OnGbps)), Summarize(values(row.Reps.OffGbps))
		row.OnBytesPerPacket = Summarize(values(row.Reps.OnBytesPerPacket))
		row.OffBytesPerPacket = Summarize(values(row.Reps.OffBytesPerPacket))
		row.Ratio = pairedRatio(row.Reps.OnGbps, row.Reps.OffGbps)
		row.Verified = bigTCPVerified(row.Reps)
	}
}

// bigTCPVerified: at least one measurement of each mode, every "on" one
// above 64 KiB per packet and every "off" one at most 64 KiB.
func bigTCPVerified(r BigTCPReps) bool {
	var on, off int
	for _, v := range r.OnBytesPerPacket {
		if v != nil {
			if *v <= BigTCPLegacySize {
				return false
			}
			on++
		}
	}
	for _, v := range r.OffBytesPerPacket {
		if v != nil {
			if *v > BigTCPLegacySize {
				return false
			}
			off++
		}
	}
	return on > 0 && off > 0
}

// Failed reports whether a measurement failed or a row's packet sizes do
// not show BIG TCP on and off.
func (r *BigTCPReport) Failed() bool {
	for _, row := range r.Rows {
		if len(row.Errors) > 0 || !row.Verified {
			return true
		}
	}
	return false
}

// WriteTable prints the section: per row the on and off Gbit/s, the paired
// ratio and the from-pod bytes per packet that show the sizes used.
func (r *BigTCPReport) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "\nBIG TCP: lanekit pod to pod, on (the agents' GSO/GRO sizes) vs off (64 KiB on the same devices), interleaved in each of %d repetitions\n", r.Repeat)
	if r.Detail != "" {
		fmt.Fprintln(w, "agents:", r.Detail)
	}
	for _, d := range r.Devices {
		fmt.Fprintln(w, "  as found:", d)
	}
	if len(r.Rows) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "row\tBIG TCP on Gbit/s\toff Gbit/s\ton/off (paired)\tbytes/packet from the pod on\toff\tverdict\t")
		for _, row := range r.Rows {
			verdict := "BIG TCP packets seen on, none off"
			if !row.Verified {
				verdict = "NOT VERIFIED: the packet sizes do not show BIG TCP on and off"
			}
			fmt.Fprintf(tw, "%s (BIG TCP on/off)\t%s\t%s\t%s\t%s\t%s\t%s\t\n", row.Name, spread(row.OnGbps, "%.2f"),
				spread(row.OffGbps, "%.2f"), pairedText(row.Ratio), spread(row.OnBytesPerPacket, "%.0f"),
				spread(row.OffBytesPerPacket, "%.0f"), verdict)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, s := range r.Skipped {
		fmt.Fprintln(w, "  not measured:", s)
	}
	var errs []error
	for _, row := range r.Rows {
		for _, e := range row.Errors {
			errs = append(errs, fmt.Errorf("%s: %s", row.Name, e))
		}
	}
	if len(errs) > 0 {
		fmt.Fprintln(w, "errors:")
		fmt.Fprintln(w, errors.Join(errs...))
	}
	return nil
}
