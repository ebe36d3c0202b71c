package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
	"time"
)

// Path is one benchmark row: traffic from ClientNS to ServerIP, which lives
// in ServerNS, or inside a VM when Guest is set (its servers are then started
// through the guest's console). Every row (host, pods, VMs) goes through the
// same code.
type Path struct {
	Name     string
	ClientNS string
	ServerNS string // for a guest: the netns its QEMU runs in (informational)
	ServerIP string
	// ListenIP is the address the servers bind ("": ServerIP): a guest
	// behind NAT (KubeVirt's masquerade) is reached at ServerIP and
	// listens on its own address.
	ListenIP string
	Guest    *Guest // nil: servers run in ServerNS
	Note     string // caveat printed with the row (e.g. "TCG guest")
	// Includes says what the path pays for (netfilter, conntrack, BPF), so
	// that rows which are not feature-equivalent are labelled as such.
	Includes Includes
	// Prepare, when set, runs before each of the path's measurements (e.g.
	// loads the NetworkPolicies the row is measured with); its failure is
	// that measurement's error.
	Prepare func(ctx context.Context) error
	// Policies: the row is measured with this many NetworkPolicies
	// selecting its pods; rows with the same PolicyBase are compared.
	Policies   *int
	PolicyBase string
	// CPUParts are the processes whose share of a guest row's host CPU is
	// reported on its own (the backend, QEMU without its vCPUs).
	CPUParts []CPUPart
}

// CPUPart is one process of a guest row's host CPU breakdown.
type CPUPart struct {
	Name string
	PID  int
}

// Includes labels a row with the packet processing its traffic goes
// through between the two endpoints.
type Includes struct {
	Netfilter bool   `json:"netfilter"` // iptables rules traversed (kube-proxy style, bridge plugin)
	Conntrack bool   `json:"conntrack"` // connection tracking on the path
	BPF       bool   `json:"bpf"`       // lanekit's BPF programs forward it
	Detail    string `json:"detail"`    // one line for the table
}

// listenIP is the address p's servers bind.
func (p Path) listenIP() string {
	if p.ListenIP != "" {
		return p.ListenIP
	}
	return p.ServerIP
}

// server starts a measurement's server for p: in ServerNS, or in the guest.
// guestArgs, when non-nil, replaces args inside a guest (a tool with another
// name there).
func (p Path) server(ctx context.Context, life time.Duration, port int, args, guestArgs []string) (stopper, error) {
	if p.Guest != nil {
		if guestArgs == nil {
			guestArgs = args
		}
		return startGuestServer(ctx, p.Guest, life, port, guestArgs...)
	}
	return startServer(ctx, life, p.ServerNS, port, args...)
}

// Options bound a run.
type Options struct {
	Duration time.Duration // per measurement
	Repeat   int           // repetitions; paths are interleaved within each
	// Self is the lanekit executable; its hidden `lab cps-server` and
	// `lab cps-client` subcommands measure connection rates.
	Self     string
	Progress io.Writer // progress lines; nil for none
	// BusyCPUs keeps every CPU busy with SCHED_IDLE spinners while RR runs,
	// so latencies do not include waking a CPU from an idle state.
	BusyCPUs bool
	// BPFCost reads the BPF programs' run time per connection during each
	// conn/s run (root; bpfcost.go).
	BPFCost bool
	// GuestPIDs are the QEMU processes of every guest on the machine: the
	// guest rows' host CPU (hostcpu.go) excludes their vCPU threads. Empty:
	// the host CPU metrics are not measured.
	GuestPIDs []int
	// CPUTCPMbps is the fixed TCP rate of the host CPU per byte (0:
	// DefaultCPUTCPMbps).
	CPUTCPMbps int
}

// Ports used inside the lab's namespaces.
const (
	iperfPort    = 5201
	sockperfPort = 11111
	cpsPort      = 12865
)

// samples holds the raw values of one path, indexed by repetition; NaN
// marks a failed measurement.
type samples struct {
	gbps, p50, p99, cps []float64
	gbpsRev             []float64 // guest rows: TCP with the guest sending (iperf3 -R)
	// guest rows: host CPU ns per byte at the fixed TCP rate (to the guest,
	// from it) and µs per transaction at the fixed RR rate (hostcpu.go)
	cpuByte, cpuByteRev, cpuTxn []float64
	// the guest NIC's interrupts in those runs, per MB (to, from) and per
	// transaction (guestirq.go)
	irqMB, irqMBRev, irqTxn []float64
	// the same per CPUPart, by part name
	cpuPartByte, cpuPartByteRev, cpuPartTxn map[string][]float64
	cpsConns, cpsErrs                       []float64 // connections made and failed, per repetition
	cpsKinds                                map[string]int64
	// BPF run time per connection of the conn/s runs and per round trip
	// of the RR runs (bpfcost.go)
	bpfConn, bpfRR bpfSamples
	// offloads: guest rows, the virtio offloads the guest's driver
	// negotiated (vmfeatures.go)
	offloads string
	errs     []string
	cur      int // the repetition being measured
}

func newSamples(repeat int) samples {
	nan := func() []float64 {
		xs := make([]float64, repeat)
		for i := range xs {
			xs[i] = math.NaN()
		}
		return xs
	}
	return samples{gbps: nan(), gbpsRev: nan(), p50: nan(), p99: nan(), cps: nan(), cpsConns: nan(), cpsErrs: nan(),
		cpuByte: nan(), cpuByteRev: nan(), cpuTxn: nan(), irqMB: nan(), irqMBRev: nan(), irqTxn: nan(), bpfConn: bpfSamples{total: nan()}, bpfRR: bpfSamples{total: nan()}}
}

func (s *samples) setLatency(lat Latency) { s.p50[s.cur], s.p99[s.cur] = lat.P50, lat.P99 }

// addCPS records a cps-client run's output as the current repetition.
func (s *samples) addCPS(out []byte) error {
	res, err := ParseCPS(out)
	if err != nil {
		return err
	}
	s.setCPS(res)
	return nil
}

func (s *samples) setCPS(res CPSResult) {
	s.cps[s.cur] = res.CPS
	s.cpsConns[s.cur], s.cpsErrs[s.cur] = float64(res.Conns), float64(res.Errors)
	for k, n := range res.ErrorKinds {
		if s.cpsKinds == nil {
			s.cpsKinds = map[string]int64{}
		}
		s.cpsKinds[k] += n
	}
}

// metric is one measurement kind; each runs one path once.
type metric struct {
	name string
	run  func(ctx context.Context, o Options, p Path, s *samples) error
	// only, when set, picks the paths the metric applies to.
	only func(Path) bool
}

var metrics = []metric{
	{"tcp", runIperf, nil},
	// A guest's own sending (VM -> pod) is what its TX offloads change.
	{"tcp-rev", runIperfRev, func(p Path) bool { return p.Guest != nil }},
	{"rr", runSockperf, nil},
	{"cps", runConnRate, nil},
	// What the VM host pays per byte and per transaction at a fixed load.
	{"cpu-tcp", runCPUTCP, hostCPURow},
	{"cpu-tcp-rev", runCPUTCPRev, hostCPURow},
	{"cpu-rr", runCPURR, hostCPURow},
}

// hostCPURow: the host CPU metrics run on guest rows over IPv4 (sockperf).
func hostCPURow(p Path) bool { return p.Guest != nil && rrTool(p) != RRToolGo }

// Run measures every path Repeat times. Within a repetition each metric runs
// over all paths back to back, starting from a rotating path so no path is
// always first. A failed measurement is recorded in the row's errors and
// leaves a gap in its samples; Run itself fails only on a cancelled context.
func Run(ctx context.Context, paths []Path, o Options) (*Report, error) {
	if o.Repeat < 1 {
		o.Repeat = 1
	}
	if o.Duration < time.Second {
		o.Duration = time.Second
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("bench: no paths to measure")
	}
	for _, p := range paths {
		if p.Guest != nil {
			defer p.Guest.Close()
		}
	}
	all := make([]samples, len(paths))
	for i := range all {
		all[i] = newSamples(o.Repeat)
		if g := paths[i].Guest; g != nil {
			all[i].offloads = guestOffloads(ctx, g)
			o.progress("%s: virtio offloads negotiated: %s", paths[i].Name, all[i].offloads)
		}
	}
	for rep := 0; rep < o.Repeat; rep++ {
		if err := measureRep(ctx, "", paths, all, rep, o); err != nil {
			return nil, err
		}
	}
	return buildReport(paths, all, o), nil
}

// measureRep measures repetition rep of every path into all (indexed like
// paths): each metric over all paths back to back, starting from a
// rotating path so no path is always first. group prefixes the progress
// lines. It fails only on a cancelled context.
func measureRep(ctx context.Context, group string, paths []Path, all []samples, rep int, o Options) error {
	if group != "" {
		group += " "
	}
	for _, m := range metrics {
		for k := range paths {
			i := (k + rep) % len(paths)
			if m.only != nil && !m.only(paths[i]) {
				continue
			}
			if strings.HasPrefix(m.name, "cpu-") && len(o.GuestPIDs) == 0 {
				continue
			}
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			all[i].cur = rep
			var err error
			if paths[i].Prepare != nil {
				err = paths[i].Prepare(ctx)
			}
			if err == nil {
				err = m.run(ctx, o, paths[i], &all[i])
			}
			if err != nil {
				all[i].errs = append(all[i].errs, fmt.Sprintf("rep %d %s: %v", rep+1, m.name, err))
			}
			o.progress("%srep %d/%d %-4s %-16s %s", group, rep+1, o.Repeat, m.name, paths[i].Name, lastValue(m.name, &all[i], err))
		}
	}
	return nil
}

func (o Options) progress(format string, args ...any) {
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, format+"\n", args...)
	}
}

func lastValue(metric string, s *samples, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	last := func(xs []float64) float64 { return xs[s.cur] }
	switch metric {
	case "tcp":
		return fmt.Sprintf("%.2f Gbit/s", last(s.gbps))
	case "tcp-rev":
		return fmt.Sprintf("%.2f Gbit/s from the guest", last(s.gbpsRev))
	case "rr":
		return fmt.Sprintf("p50 %.1f µs p99 %.1f µs", last(s.p50), last(s.p99))
	case "cpu-tcp":
		return fmt.Sprintf("%.2f host CPU ns/byte to the guest", last(s.cpuByte))
	case "cpu-tcp-rev":
		return fmt.Sprintf("%.2f host CPU ns/byte from the guest", last(s.cpuByteRev))
	case "cpu-rr":
		return fmt.Sprintf("%.1f host CPU µs/transaction", last(s.cpuTxn))
	default:
		return fmt.Sprintf("%.0f conn/s, %.0f connection errors", last(s.cps), last(s.cpsErrs))
	}
}

func secondsArg(d time.Duration) string {
	return strconv.Itoa(int(math.Ceil(d.Seconds())))
}

func hostPort(ip string, port int) string {
	return net.JoinHostPort(ip, strconv.Itoa(port))
}

// runIperf: single-stream TCP throughput with iperf3 (one-off server).
func runIperf(ctx context.Context, o Options, p Path, s *samples) error {
	return iperf(ctx, o, p, false, s.gbps, s.cur)
}

// runIperfRev: runIperf with the server sending (iperf3 -R).
func runIperfRev(ctx context.Context, o Options, p Path, s *samples) error {
	return iperf(ctx, o, p, true, s.gbpsRev, s.cur)
}

// startIperf starts a one-off iperf3 server for p and returns it with the
// client's command line (-R: the server sends; extra appended).
func startIperf(ctx context.Context, o Options, p Path, reverse bool, extra ...string) (stopper, []string, error) {
	life := o.Duration + 20*time.Second
	srv, err := p.server(ctx, life, iperfPort,
		[]string{"iperf3", "-s", "-1", "-B", p.listenIP(), "-p", strconv.Itoa(iperfPort)}, nil)
	if err != nil {
		return nil, nil, err
	}
	args := []string{"iperf3", "-c", p.ServerIP, "-p", strconv.Itoa(iperfPort), "-t", secondsArg(o.Duration), "-J"}
	if reverse {
		args = append(args, "-R")
	}
	return srv, append(args, extra...), nil
}

func iperf(ctx context.Context, o Options, p Path, reverse bool, into []float64, cur int) error {
	srv, args, err := startIperf(ctx, o, p, reverse)
	if err != nil {
		return err
	}
	defer srv.stop()
	out, err := runIn(ctx, o.Duration+15*time.Second, p.ClientNS, args...)
	gbps, perr := ParseIperf3(out)
	if perr != nil {
		if err != nil {
			return err
		}
		return perr
	}
	into[cur] = gbps
	return nil
}

// startSockperf starts a sockperf server for p and returns it with the
// ping-pong client's command line (round trips in µs, for o.Duration).
func startSockperf(ctx context.Context, o Options, p Path) (stopper, []string, error) {
	srv, err := p.server(ctx, o.Duration+20*time.Second, sockperfPort,
		[]string{"sockperf", "sr", "--tcp", "-i", p.listenIP(), "-p", strconv.Itoa(sockperfPort)}, nil)
	if err != nil {
		return nil, nil, err
	}
	return srv, []string{"sockperf", "pp", "--tcp", "-i", p.ServerIP, "-p", strconv.Itoa(sockperfPort),
		"-t", secondsArg(o.Duration), "--full-rtt"}, nil
}

// runSockperf: TCP request/response round trips with sockperf ping-pong.
func runSockperf(ctx context.Context, o Options, p Path, s *samples) error {
	if rrTool(p) == RRToolGo { // rr.go: sockperf 3.7 has no IPv6
		return runGoRR(ctx, o, p, s)
	}
	life := o.Duration + 20*time.Second
	srv, args, err := startSockperf(ctx, o, p)
	if err != nil {
		return err
	}
	defer srv.stop()
	if o.BusyCPUs {
		sp, err := startSpinners(ctx, o.Self, life)
		if err != nil {
			return err
		}
		defer sp.stop()
	}
	return s.rrRun(o, func() ([]byte, error) { return runIn(ctx, o.Duration+15*time.Second, p.ClientNS, args...) })
}

// rrRun runs a sockperf ping-pong client (run returns its output) with the
// BPF programs' run time read around it, and records both as the current
// repetition.
func (s *samples) rrRun(o Options, run func() ([]byte, error)) error {
	before := o.bpfBefore()
	if before != nil {
		defer before.close()
	}
	out, err := run()
	if err != nil {
		return err
	}
	lat, err := ParseSockperf(out)
	if err != nil {
		return err
	}
	s.bpfRR.add(s.cur, before, int64(lat.Received))
	s.setLatency(lat)
	return nil
}

// runConnRate: TCP connections per second (connect, 1 byte, close) with the
// lanekit helper subcommands.
func runConnRate(ctx context.Context, o Options, p Path, s *samples) error {
	srv, run, err := pathConns(ctx, o, p, cpsPort)
	if err != nil {
		return err
	}
	defer srv.stop()
	return s.connRun(o, run)
}

// pathConns starts p's cps server on port and returns it with the client's
// run (its JSON line), for the caller to time and stop.
func pathConns(ctx context.Context, o Options, p Path, port int) (stopper, func() ([]byte, error), error) {
	if o.Self == "" {
		return nil, nil, fmt.Errorf("cps: lanekit executable unknown")
	}
	life := o.Duration + 20*time.Second
	addr, listen := hostPort(p.ServerIP, port), hostPort(p.listenIP(), port)
	srv, err := p.server(ctx, life, port,
		[]string{o.Self, "lab", "cps-server", "--listen", listen, "--for", life.String()},
		[]string{"lk-bench", "cps-server", "--listen", listen, "--for", life.String()})
	if err != nil {
		return nil, nil, err
	}
	return srv, func() ([]byte, error) {
		return runIn(ctx, o.Duration+15*time.Second, p.ClientNS,
			o.Self, "lab", "cps-client", "--addr", addr, "--duration", o.Duration.String())
	}, nil
}

// connRun runs a conn/s client (run returns its JSON line) with the BPF
// programs' run time read around it, and records both as the current
// repetition.
func (s *samples) connRun(o Options, run func() ([]byte, error)) error {
	before := o.bpfBefore()
	if before != nil {
		defer before.close()
	}
	out, err := run()
	if err != nil {
		return err
	}
	res, err := ParseCPS(out)
	if err != nil {
		return err
	}
	s.bpfConn.add(s.cur, before, res.Conns)
	s.setCPS(res)
	return nil
}
