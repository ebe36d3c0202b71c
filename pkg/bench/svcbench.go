package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lanekit/lanekit/pkg/netdev"
)

// Service-row modes (the row's path name is "svc-<mode>").
const (
	SvcModeIptables = "kube-proxy-iptables"
	SvcModeNftables = "kube-proxy-nftables"
	SvcModeLanekit  = "lanekit"
	// Host-client rows: the client is a process in the node's netns (the
	// node itself, a hostNetwork pod), reaching the same VIP: kube-proxy's
	// nat OUTPUT rules, lanekit's socket load balancer.
	SvcModeIptablesHost = SvcModeIptables + SvcHostSuffix
	SvcModeNftablesHost = SvcModeNftables + SvcHostSuffix
	SvcModeLanekitHost  = SvcModeLanekit + SvcHostSuffix
	SvcHostSuffix       = "-host"
)

// SvcBaseMode is the datapath of a row mode (a host-client mode's without
// the suffix) and whether the client is a process in the node.
func SvcBaseMode(mode string) (string, bool) {
	if base, ok := strings.CutSuffix(mode, SvcHostSuffix); ok {
		return base, true
	}
	return mode, false
}

// SvcProgrammer loads a SvcSet into one datapath: kube-proxy-shaped rules
// into a node netns, or services into a lanekit agent.
type SvcProgrammer interface {
	// Program loads all of set into an empty datapath and returns how long
	// the programming step took (what is timed is the programmer's
	// ProgramLabel), giving up after limit. A *ProgramTimeoutError means the
	// timed step did not finish but the set was loaded another way.
	Program(ctx context.Context, set *SvcSet, limit time.Duration) (time.Duration, error)
	// Change moves the datapath from old to cur, which differ in service
	// `changed` only, and returns the time the change took.
	Change(ctx context.Context, old, cur *SvcSet, changed int) (time.Duration, error)
	// Clear removes what Program loaded (untimed).
	Clear(ctx context.Context) error
	// ProgramLabel and ChangeLabel say what the timings cover.
	ProgramLabel() string
	ChangeLabel() string
}

// ErrChangeNotTimed is what a programmer's Change returns when it cannot
// time a change (the row then has no change times, and no error).
var ErrChangeNotTimed = errors.New("change not timed")

// SvcBackend is a real pod behind the client's service.
type SvcBackend struct {
	NS string
	IP netip.Addr
}

// SvcPath is one service row: a client pod reaching the service VIP of a
// SvcSet of Services services through one datapath.
type SvcPath struct {
	Mode     string // SvcMode*
	Services int
	ClientNS string
	// ClientCgroup, when set, is the cgroup2 directory the client runs in
	// (a host-client row's node cgroup: where lanekit's socket load
	// balancer is attached).
	ClientCgroup string
	Backends     []SvcBackend
	// NodeNS is where the rules live (informational).
	NodeNS      string
	ClusterCIDR netip.Prefix
	Includes    Includes
	Prog        SvcProgrammer
	// Shared: one datapath serves all of the mode's rows (one agent), so it
	// is not cleared before the row is programmed: the sets are nested and
	// rows run in ascending service count, so programming a row's set only
	// adds services (the previous row's are unchanged upserts). Deleting
	// thousands of services one API call at a time takes minutes.
	Shared bool
	// Datapath, when set, is timed too (program all, one change) at every
	// repetition, without traffic: lanekit's datapath alone next to the
	// agent's end-to-end times.
	Datapath SvcProgrammer
	// Raw, when set, is measured right after each conn/s run: the same
	// client (cps-client, 2 loops) between two raw hosts on the lab's wire,
	// no rules, no BPF: this lab's physical limit for the row, and the
	// reference that makes labs measured one after the other comparable
	// (the machine's load moves both alike).
	Raw *SvcRaw
}

// SvcRaw is a raw-host pair of the lab (network namespaces).
type SvcRaw struct {
	ClientNS, ServerNS, ServerIP string
}

// Name is the row's label.
func (p SvcPath) Name() string { return fmt.Sprintf("%s/%d", p.Mode, p.Services) }

// SvcOptions bound a service run.
type SvcOptions struct {
	Options
	// ProgramTimeout bounds one full programming step (iptables-restore of
	// 10,000 services takes minutes with iptables-nft).
	ProgramTimeout time.Duration
}

// Ports of the client's service (targets are the same numbers): not the
// pod rows' ports, so that no flow of the service rows shares its backend
// 4-tuple with a pod row's direct flow to the same pod.
const (
	svcCPSPort    = cpsPort + 1
	svcRRPort     = sockperfPort + 1
	svcRawCPSPort = cpsPort + 2 // SvcPath.Raw's server, on a raw host
)

// SvcPortRR names the client service's RR port (one sockperf connection a run).
const SvcPortRR = "rr"

var svcUsedPorts = []SvcPort{{Name: "cps", Port: svcCPSPort, TargetPort: svcCPSPort}, {Name: SvcPortRR, Port: svcRRPort, TargetPort: svcRRPort}}

// svcSamples are one service row's raw values per repetition.
type svcSamples struct {
	samples
	program, change, changeBack []float64 // ms
	rawCPS                      []float64 // SvcPath.Raw's conn/s, per repetition
	dpProgram, dpChange         []float64 // ms, SvcPath.Datapath
	set                         *SvcSet
	programmed                  bool
	programNote                 string // the timed programming step did not finish
	proxyMetrics                []ProxyMetric
	proxyMetricsNote            string
	broken                      bool // programming failed: no traffic rows
}

// RunServices measures every service row Repeat times: each repetition runs
// the rows back to back from a rotating start; a row (re)programs when it
// must, times one change (an endpoint removed) and its restoration, then
// measures connections/s and RR through the client service's VIP with
// servers in every backend pod.
func RunServices(ctx context.Context, paths []SvcPath, o SvcOptions) (*SvcReport, error) {
	if o.Repeat < 1 {
		o.Repeat = 1
	}
	if o.Duration < time.Second {
		o.Duration = time.Second
	}
	if o.ProgramTimeout <= 0 {
		o.ProgramTimeout = 10 * time.Minute
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("services bench: no rows")
	}
	all := make([]svcSamples, len(paths))
	for i, p := range paths {
		if len(p.Backends) == 0 {
			return nil, fmt.Errorf("services bench: %s has no backends", p.Name())
		}
		eps := make([]netip.Addr, len(p.Backends))
		for k, b := range p.Backends {
			eps[k] = b.IP
		}
		set, err := NewSvcSet(p.Services, svcUsedPorts, eps, p.ClusterCIDR)
		if err != nil {
			return nil, fmt.Errorf("services bench: %s: %w", p.Name(), err)
		}
		nan := func() []float64 { return newSamples(o.Repeat).cps }
		all[i] = svcSamples{samples: newSamples(o.Repeat), program: nan(), change: nan(), changeBack: nan(),
			dpProgram: nan(), dpChange: nan(), rawCPS: nan(), set: set}
	}
	defer func() {
		for _, p := range paths {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.ProgramTimeout)
			for _, prog := range []SvcProgrammer{p.Prog, p.Datapath} {
				if prog == nil || (prog == p.Prog && p.Shared) {
					continue // the owner of a shared programmer removes its services
				}
				if err := prog.Clear(cctx); err != nil {
					o.progress("services: clear %s: %v", p.Name(), err)
				}
			}
			cancel()
		}
	}()
	// Stages by service count, ascending: within a stage every row with that
	// count is measured Repeat times, interleaved from a rotating start, so
	// the modes are compared back to back at the same count.
	var counts []int
	for _, p := range paths {
		if !slices.Contains(counts, p.Services) {
			counts = append(counts, p.Services)
		}
	}
	slices.Sort(counts)
	for _, n := range counts {
		var stage []int
		for i, p := range paths {
			if p.Services == n {
				stage = append(stage, i)
			}
		}
		for rep := 0; rep < o.Repeat; rep++ {
			for k := range stage {
				i := stage[(k+rep)%len(stage)]
				if err := ctx.Err(); err != nil {
					return nil, fmt.Errorf("services bench: %w", err)
				}
				runSvcRow(ctx, o, paths[i], &all[i], rep)
			}
		}
	}
	return buildSvcReport(paths, all, o), nil
}

// runSvcRow runs one row's repetition rep; failures land in s.errs.
func runSvcRow(ctx context.Context, o SvcOptions, p SvcPath, s *svcSamples, rep int) {
	s.cur = rep
	fail := func(what string, err error) {
		s.errs = append(s.errs, fmt.Sprintf("rep %d %s: %v", rep+1, what, err))
		o.progress("services rep %d/%d %-26s %s: error: %v", rep+1, o.Repeat, p.Name(), what, err)
	}
	if s.broken {
		return
	}
	if !s.programmed {
		if !p.Shared {
			if err := p.Prog.Clear(ctx); err != nil {
				fail("clear", err)
				return
			}
		}
		d, err := p.Prog.Program(ctx, s.set, o.ProgramTimeout)
		var slow *ProgramTimeoutError
		switch {
		case errors.As(err, &slow):
			s.programNote = slow.Error()
			o.progress("services rep %d/%d %-26s program %d services: %v", rep+1, o.Repeat, p.Name(), p.Services, slow)
		case err != nil:
			fail("program", err)
			s.broken = true // a row without its services has nothing to measure
			return
		default:
			s.program[rep] = ms(d)
			o.progress("services rep %d/%d %-26s program %d services: %.1f ms", rep+1, o.Repeat, p.Name(), p.Services, ms(d))
			if r, ok := p.Prog.(ProxyMetricsReader); ok {
				s.proxyMetrics, s.proxyMetricsNote = r.ProxyMetrics()
				for _, m := range s.proxyMetrics {
					o.progress("services rep %d/%d %-26s own metric: %s", rep+1, o.Repeat, p.Name(), m)
				}
				if s.proxyMetricsNote != "" {
					o.progress("services rep %d/%d %-26s own metrics: %s", rep+1, o.Repeat, p.Name(), s.proxyMetricsNote)
				}
			}
		}
		s.programmed = true
	}
	change := s.set.DefaultChange()
	if without, err := s.set.Without(change); err != nil {
		fail("change", err)
	} else {
		cctx, cancel := context.WithTimeout(ctx, o.ProgramTimeout)
		d1, err := p.Prog.Change(cctx, s.set, without, change.Service)
		var d2 time.Duration
		if err == nil {
			d2, err = p.Prog.Change(cctx, without, s.set, change.Service)
		}
		cancel()
		switch {
		case errors.Is(err, ErrChangeNotTimed):
		case err != nil:
			fail("change", err)
		default:
			s.change[rep], s.changeBack[rep] = ms(d1), ms(d2)
			o.progress("services rep %d/%d %-26s one endpoint removed: %.2f ms, restored: %.2f ms", rep+1, o.Repeat, p.Name(), ms(d1), ms(d2))
		}
	}
	if p.Datapath != nil {
		if err := svcDatapathTimes(ctx, o, p, s, rep); err != nil {
			fail("datapath only", err)
		}
	}
	vip := s.set.Services[s.set.Used].IP.String()
	if err := svcConnRate(ctx, o, p, vip, s); err != nil {
		fail("cps", err)
	} else {
		o.progress("services rep %d/%d %-26s %.0f conn/s, %.0f connection errors", rep+1, o.Repeat, p.Name(), s.cps[rep], s.cpsErrs[rep])
	}
	if p.Raw != nil {
		if res, err := rawConnRate(ctx, o.Options, *p.Raw); err != nil {
			fail("raw cps", err)
		} else {
			s.rawCPS[rep] = res.CPS
			o.progress("services rep %d/%d %-26s raw hosts, same client: %.0f conn/s", rep+1, o.Repeat, p.Name(), res.CPS)
		}
	}
	if err := svcRR(ctx, o, p, vip, s); err != nil {
		fail("rr", err)
	} else {
		o.progress("services rep %d/%d %-26s RR p50 %.1f µs p99 %.1f µs", rep+1, o.Repeat, p.Name(), s.p50[rep], s.p99[rep])
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// svcDatapathTimes times p.Datapath: program all, then the change (its
// restoration is not recorded), then frees it.
func svcDatapathTimes(ctx context.Context, o SvcOptions, p SvcPath, s *svcSamples, rep int) error {
	defer p.Datapath.Clear(ctx)
	d, err := p.Datapath.Program(ctx, s.set, o.ProgramTimeout)
	if err != nil {
		return err
	}
	change := s.set.DefaultChange()
	without, err := s.set.Without(change)
	if err != nil {
		return err
	}
	c, err := p.Datapath.Change(ctx, s.set, without, change.Service)
	if err != nil {
		return err
	}
	s.dpProgram[rep], s.dpChange[rep] = ms(d), ms(c)
	o.progress("services rep %d/%d %-26s datapath only: program %.1f ms, one endpoint removed %.2f ms", rep+1, o.Repeat, p.Name(), ms(d), ms(c))
	return nil
}

// backendServers starts args(ip) in every backend pod of p.
func backendServers(ctx context.Context, life time.Duration, p SvcPath, port int, args func(ip string) []string) (func(), error) {
	var started []*server
	stop := func() {
		for _, s := range started {
			s.stop()
		}
	}
	for _, b := range p.Backends {
		srv, err := startServer(ctx, life, b.NS, port, args(b.IP.String())...)
		if err != nil {
			stop()
			return nil, err
		}
		started = append(started, srv)
	}
	return stop, nil
}

// svcConnRate: connections/s to the VIP, spread over the backends.
func svcConnRate(ctx context.Context, o SvcOptions, p SvcPath, vip string, s *svcSamples) error {
	return s.connRun(o.Options, func() ([]byte, error) { return vipConns(ctx, o.Options, p, vip, svcCPSPort, 2) })
}

// rawConnRate runs the pod rows' conn/s client (2 loops, as the service
// rows') between raw hosts r.
func rawConnRate(ctx context.Context, o Options, r SvcRaw) (CPSResult, error) {
	srv, run, err := pathConns(ctx, o, Path{ClientNS: r.ClientNS, ServerNS: r.ServerNS, ServerIP: r.ServerIP}, svcRawCPSPort)
	if err != nil {
		return CPSResult{}, err
	}
	defer srv.stop()
	out, err := run()
	if err != nil {
		return CPSResult{}, err
	}
	return ParseCPS(out)
}

// vipConns runs the cps client's `parallel` loops against vip:port from
// p's client, with cps servers in p's backends on port, and returns its
// JSON line.
func vipConns(ctx context.Context, o Options, p SvcPath, vip string, port, parallel int) ([]byte, error) {
	if o.Self == "" {
		return nil, fmt.Errorf("cps: lanekit executable unknown")
	}
	life := o.Duration + 20*time.Second
	stop, err := backendServers(ctx, life, p, port, func(ip string) []string {
		return []string{o.Self, "lab", "cps-server", "--listen", hostPort(ip, port), "--for", life.String()}
	})
	if err != nil {
		return nil, err
	}
	defer stop()
	return runInCgroup(ctx, o.Duration+15*time.Second, p.ClientNS, p.ClientCgroup,
		o.Self, "lab", "cps-client", "--addr", hostPort(vip, port), "--duration", o.Duration.String(),
		"--parallel", strconv.Itoa(parallel))
}

// ConnectProbe opens new connections to vip:port from p's client one at a
// time for o.Duration, with servers on port in p's backends (the Service's
// port and target port): connect() time (the first packet of each new flow
// through the Service) and connections per second. The Service must
// already be programmed.
//
// Give each Service a port of its own: a client that reached the same
// backend port through another address (an earlier Service's VIP, or the
// pod directly) within the server's TIME_WAIT (60 s) derives different
// initial sequence numbers and timestamps for the reused tuples, the
// server's TIME_WAIT sockets refuse a share of the new SYNs, and
// connections slow ~20× (measured: 4,700 → 180 conn/s) — any DNAT does this,
// kube-proxy's too; the bench would measure the collision.
func ConnectProbe(ctx context.Context, o Options, p SvcPath, vip string, port int) (CPSResult, error) {
	out, err := vipConns(ctx, o, p, vip, port, 1)
	if err != nil {
		return CPSResult{}, err
	}
	return ParseCPS(out)
}

// svcRR: sockperf ping-pong to the VIP (one connection: one backend).
func svcRR(ctx context.Context, o SvcOptions, p SvcPath, vip string, s *svcSamples) error {
	life := o.Duration + 20*time.Second
	stop, err := backendServers(ctx, life, p, svcRRPort, func(ip string) []string {
		return []string{"sockperf", "sr", "--tcp", "-i", ip, "-p", strconv.Itoa(svcRRPort)}
	})
	if err != nil {
		return err
	}
	defer stop()
	if o.BusyCPUs {
		sp, err := startSpinners(ctx, o.Self, life)
		if err != nil {
			return err
		}
		defer sp.stop()
	}
	return s.rrRun(o.Options, func() ([]byte, error) {
		return runInCgroup(ctx, o.Duration+15*time.Second, p.ClientNS, p.ClientCgroup,
			"sockperf", "pp", "--tcp", "-i", vip, "-p", strconv.Itoa(svcRRPort),
			"-t", secondsArg(o.Duration), "--full-rtt")
	})
}

// RuleProgrammer loads kube-proxy-shaped rules into a node netns the way
// kube-proxy does: one iptables-restore --noflush (iptables mode) or one
// nft -f transaction (nftables mode) per sync, exec'd from a thread inside
// the netns (no `ip netns exec` in the timing).
type RuleProgrammer struct {
	NS   string // netns name (/run/netns/NS)
	Mode string // SvcModeIptables or SvcModeNftables
}

// ProgramTimeoutError says the timed full sync did not finish within Limit
// and how the rules were loaded instead (so traffic is still measured).
type ProgramTimeoutError struct {
	Limit    time.Duration
	Fallback string
}

func (e *ProgramTimeoutError) Error() string {
	return fmt.Sprintf("the full sync did not finish within %s (not measured); rules then loaded %s", e.Limit, e.Fallback)
}

// ruleChunk is how many services each fallback iptables-restore loads.
const ruleChunk = 500

// Program times the full sync into the netns (Clear empties it first),
// giving up after limit; iptables mode then loads the same rules in
// ruleChunk-service restores, untimed.
func (r RuleProgrammer) Program(ctx context.Context, set *SvcSet, limit time.Duration) (time.Duration, error) {
	tctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var took time.Duration
	var err error
	if r.Mode == SvcModeNftables {
		took, err = r.load(tctx, set.NftFull(), "nft", "-f", "-")
	} else {
		took, err = r.load(tctx, set.IptablesFull(), "iptables-restore", "--noflush")
	}
	if err == nil || tctx.Err() == nil || ctx.Err() != nil || r.Mode == SvcModeNftables {
		return took, err
	}
	// Timed out: load the identical rules in chunks to measure traffic.
	if cerr := r.Clear(ctx); cerr != nil {
		return took, cerr
	}
	fctx, fcancel := context.WithTimeout(ctx, limit)
	defer fcancel()
	chunks := set.IptablesChunks(ruleChunk)
	for i, c := range chunks {
		if _, cerr := r.load(fctx, c, "iptables-restore", "--noflush"); cerr != nil {
			return took, fmt.Errorf("full sync gave up after %s; chunk %d of %d: %w", limit, i+1, len(chunks), cerr)
		}
	}
	return took, &ProgramTimeoutError{Limit: limit, Fallback: fmt.Sprintf("in %d iptables-restore runs of %d services (untimed)", len(chunks), ruleChunk)}
}

// Change times kube-proxy's partial sync for the change.
func (r RuleProgrammer) Change(ctx context.Context, old, cur *SvcSet, changed int) (time.Duration, error) {
	if r.Mode == SvcModeNftables {
		return r.load(ctx, cur.NftPartial(old, changed), "nft", "-f", "-")
	}
	return r.load(ctx, cur.IptablesPartial(old, changed), "iptables-restore", "--noflush", "--counters")
}

// Clear empties the netns's whole ruleset (it holds only these rules).
func (r RuleProgrammer) Clear(ctx context.Context) error {
	_, err := r.load(ctx, "flush ruleset\n", "nft", "-f", "-")
	return err
}

// ProgramLabel says what Program times.
func (r RuleProgrammer) ProgramLabel() string {
	if r.Mode == SvcModeNftables {
		return "nft -f of kube-proxy's full-sync transaction into an empty netns (wall time, fork+exec included)"
	}
	return "iptables-restore --noflush of kube-proxy's full sync (+ its jump rules) into an empty netns (wall time, fork+exec included)"
}

// ChangeLabel says what Change times.
func (r RuleProgrammer) ChangeLabel() string {
	if r.Mode == SvcModeNftables {
		return "nft -f of kube-proxy's partial-sync transaction (the service's chains rewritten)"
	}
	return "iptables-restore --noflush of kube-proxy's partial sync (filter table + KUBE-SERVICES in full, the service's chains)"
}

// load runs argv with input on stdin from a thread inside the netns and
// returns its wall time.
func (r RuleProgrammer) load(ctx context.Context, input string, argv ...string) (time.Duration, error) {
	var took time.Duration
	err := netdev.InNetns("/run/netns/"+r.NS, func() error {
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Stdin = strings.NewReader(input)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		err := cmd.Run()
		took = time.Since(start)
		if err != nil {
			if ctx.Err() != nil {
				err = fmt.Errorf("%w (gave up after %s)", err, took.Round(time.Second))
			}
			return fmt.Errorf("%s in %s (%d lines): %w: %s", argv[0], r.NS, strings.Count(input, "\n"), err, lastLine(out.String()))
		}
		return nil
	})
	return took, err
}
