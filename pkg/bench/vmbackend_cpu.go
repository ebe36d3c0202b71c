package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/pkg/netdev"
)

// CPU time per forwarded frame at a fixed offered load, both directions.
//
// Saturation throughput says which backend is faster when both run flat out;
// it does not say what a frame costs when the load is what a VM usually
// offers. Here the same load (cpuRate frames/s of cpuSize bytes, well below
// what either backend carries) goes through each backend and the backend
// process's CPU time over the window (/proc/PID/task/*/schedstat: run time in
// ns, all threads) is divided by the frames delivered.
//
// The load comes from a paced source, never from a busy-polling one:
//
//   - guest→wire: paced_guest (vhost/examples) transmits cpuRate frames/s in
//     rounds of about 50 µs, kicking only when the device asks (EVENT_IDX);
//     delivered = the wire peer's rx counter. The guest runs at real-time
//     priority 1 (it sleeps between rounds): a VM's vCPU would not share its
//     core with the generator and other processes.
//   - wire→guest: a paced AF_PACKET sender in this process, on a thread
//     pinned to CPU 0, writes frames for the VM's MAC on the wire side;
//     paced_guest --mode rx takes them (sleeping between rounds) and its
//     count is "delivered".
//
// Backends and the sender run at nice -10 (cpuNice). Both sources and the
// guest run on CPU 0 (with the veth's XDP and AF_XDP copy, which run in the
// sender's softirq), the backend alone on CPU 1: the generator cannot take
// the measured core's time. A run whose source fell below 90% of the rate,
// or whose backend delivered less than half of it, is an error, not a row.
//
// Busy polling: testpmd's forwarding lcore polls without pause, so its
// process CPU is a whole core at any load. Both backends therefore also give
// their busy time, the same accounting on both sides: testpmd's
// --record-core-cycles (TSC cycles of the forwarding iterations that
// received frames, per frame received) and lanekit-vhost's
// lanekit_vhost_busy_seconds_total (queue runs that moved frames), with
// lanekit-vhost event-driven (--poll-us 0: it sleeps in epoll, and its
// process CPU includes every wakeup). The busy ratio is the target's; the
// process ratio (testpmd's idle polling in) and the conservative one
// (lanekit-vhost's whole process CPU against testpmd's busy time) are shown
// beside it. testpmd's af_xdp PMD runs with busy_budget=0: with its default
// preferred busy polling it drives the veth's NAPI from its own core (a
// recvfrom in every receive burst), which moves the XDP program and the
// AF_XDP copy (work lanekit-vhost leaves to the sender's softirq on CPU 0)
// onto the measured core, so the two would not be measuring the same work.
// Both busy times are wall clock (TSC, CLOCK_MONOTONIC): a preemption inside
// a busy round counts, and a busy poller is preempted inside one more often
// than a backend that sleeps between rounds, so only a quiet machine gives a
// fair busy ratio (the table shows the load average). Kernel softirq work
// that the scheduler does not charge to the task (the veth peer's receive
// with IRQ-time accounting) is outside all these numbers.

// CPU comparison constants.
const (
	cpuRate   = 50_000 // frames/s offered in each direction
	cpuSize   = 64
	cpuWarmup = time.Second
	// cpuMinShare: delivered/offered below this is an error. Less than all
	// is a row with its delivered share shown: testpmd forwards without
	// backpressure (frames the guest ring has no room for are dropped, where
	// lanekit-vhost leaves them on the AF_XDP ring), so a few ms of a busy
	// machine's scheduling cost it frames; its busy time is per frame it
	// received, so its ns/frame stays comparable.
	cpuMinShare = 0.5
	cpuMinRate  = 0.9 // offered below this share of cpuRate: the source did not keep the rate
	cpuBurst    = 256 // most frames the paced sender sends at once (after a stall: the guest ring)
	// cpuNice is the backends' and the sender's nice value: on a shared
	// machine a backend starved for a few ms drops frames (AF_XDP ring full)
	// and the run is lost; CPU time is counted the same at any priority.
	cpuNice      = "-10"
	cpuSetupNote = "offered %d frames/s of %d B per direction from a paced source on CPU 0 (guest→wire: paced_guest tx; " +
		"wire→guest: a paced AF_PACKET sender + paced_guest rx), backend alone on CPU 1; " +
		"CPU = process run time (schedstat) / frames delivered; busy = time in forwarding rounds that moved frames / frames " +
		"(lanekit-vhost: lanekit_vhost_busy_seconds_total, event-driven --poll-us 0; testpmd: --record-core-cycles, busy polling, af_xdp busy_budget=0)"
)

// BackendCPU is the "cpu_per_frame" object of the backend comparison.
type BackendCPU struct {
	OfferedPPS  float64       `json:"offered_pps"`
	Size        int           `json:"size"`
	Setup       string        `json:"setup"`
	GuestToWire *CPUDirection `json:"guest_to_wire,omitempty"`
	WireToGuest *CPUDirection `json:"wire_to_guest,omitempty"`
}

// CPUDirection compares one direction (ratios of medians, lanekit-vhost over
// testpmd, null when unknown). Ratio compares the same accounting on both
// sides: busy ns/frame (time in forwarding rounds that moved frames).
// ProcessRatio is what each process took from its core per frame (testpmd's
// includes its idle polling); ConservativeRatio sets lanekit-vhost's whole
// process CPU (wakeups included) against testpmd's busy time.
type CPUDirection struct {
	LanekitVhost      CPUSide  `json:"lanekit_vhost"`
	Testpmd           CPUSide  `json:"testpmd"`
	Ratio             *float64 `json:"ratio"`
	ProcessRatio      *float64 `json:"process_ratio"`
	ConservativeRatio *float64 `json:"conservative_ratio"`
}

// CPUSide is one backend's runs in one direction.
type CPUSide struct {
	Mode         string  `json:"mode"`
	DeliveredPPS Summary `json:"delivered_pps"`
	// DeliveredShare: delivered over offered frames.
	DeliveredShare Summary `json:"delivered_share"`
	// CPUShare: process CPU time over the window (1 = one core).
	CPUShare Summary `json:"cpu_share"`
	// NsPerFrame: process CPU ns per delivered frame.
	NsPerFrame Summary `json:"ns_per_frame"`
	// BusyNsPerFrame: time in forwarding rounds that moved frames, per
	// frame (testpmd: --record-core-cycles; lanekit-vhost:
	// lanekit_vhost_busy_seconds_total).
	BusyNsPerFrame Summary `json:"busy_ns_per_frame"`
}

// cpuRun is one measurement.
type cpuRun struct {
	frames  uint64        // delivered in the window
	offered uint64        // sent by the source in the window
	cpu     time.Duration // backend process run time in the window
	window  time.Duration
	busyNs  float64 // testpmd: busy ns per frame (0: none)
}

func (r cpuRun) nsPerFrame() float64 {
	if r.frames == 0 {
		return math.NaN()
	}
	return float64(r.cpu.Nanoseconds()) / float64(r.frames)
}

func (r cpuRun) pps() float64 { return float64(r.frames) / r.window.Seconds() }

func (r cpuRun) share() float64 { return r.cpu.Seconds() / r.window.Seconds() }

func (r cpuRun) delivered() float64 { return float64(r.frames) / float64(r.offered) }

// check refuses a run whose backend did not carry the offered load: its CPU
// per frame would be a saturation number.
func (r cpuRun) check() error {
	if r.offered == 0 || r.frames == 0 {
		return fmt.Errorf("no frames (offered %d, delivered %d)", r.offered, r.frames)
	}
	if off := float64(r.offered) / r.window.Seconds(); off < cpuMinRate*cpuRate {
		return fmt.Errorf("the source offered %.0f frames/s of %d: it did not keep the rate (busy machine)", off, cpuRate)
	}
	if float64(r.frames) < cpuMinShare*float64(r.offered) {
		return fmt.Errorf("delivered %d of %d offered frames (%.1f%%): the backend did not carry the load", r.frames, r.offered,
			100*float64(r.frames)/float64(r.offered))
	}
	return nil
}

// cpuValues collects runs per kind name ("lanekit_vhost_tx" ...).
type cpuValues map[string][]cpuRun

// cpuSide summarizes runs.
func cpuSide(mode string, runs []cpuRun) CPUSide {
	var pps, del, share, ns, bns []float64
	for _, r := range runs {
		pps, share, ns = append(pps, r.pps()), append(share, r.share()), append(ns, r.nsPerFrame())
		del, bns = append(del, r.delivered()), append(bns, r.busyNs)
	}
	return CPUSide{Mode: mode, DeliveredPPS: Summarize(pps), DeliveredShare: Summarize(del), CPUShare: Summarize(share),
		NsPerFrame: Summarize(ns), BusyNsPerFrame: Summarize(bns)}
}

// cpuDirection compares the two backends' runs in one direction.
func cpuDirection(lk, tp []cpuRun) *CPUDirection {
	if len(lk) == 0 && len(tp) == 0 {
		return nil
	}
	d := &CPUDirection{
		LanekitVhost: cpuSide("event-driven (--poll-us 0)", lk),
		Testpmd:      cpuSide("busy polling (af_xdp busy_budget=0)", tp),
	}
	ratio := func(a, b float64) *float64 {
		if a > 0 && b > 0 {
			r := a / b
			return &r
		}
		return nil
	}
	l, t := d.LanekitVhost, d.Testpmd
	d.Ratio = ratio(l.BusyNsPerFrame.Median, t.BusyNsPerFrame.Median)
	d.ProcessRatio = ratio(l.NsPerFrame.Median, t.NsPerFrame.Median)
	d.ConservativeRatio = ratio(l.NsPerFrame.Median, t.BusyNsPerFrame.Median)
	return d
}

// CPU measurement kinds.
var cpuKinds = []struct {
	name    string
	rx      bool
	testpmd bool
}{
	{"lanekit_vhost_tx", false, false}, {"testpmd_tx", false, true},
	{"lanekit_vhost_rx", true, false}, {"testpmd_rx", true, true},
}

// runCPU measures every CPU kind Repeat times, interleaved like the rest.
func (b *backendBench) runCPU(ctx context.Context, rep *BackendReport) {
	guest := findExample(b.o.VhostBin, "lanekit-paced-guest", "paced_guest", b.o.PacedGuestBin)
	if _, err := os.Stat(guest); err != nil {
		rep.Errors = append(rep.Errors, fmt.Sprintf("cpu per frame: no paced_guest (%s): make build", guest))
		return
	}
	vals := cpuValues{}
	for r := 0; r < b.o.Repeat; r++ {
		for k := range cpuKinds {
			kind := cpuKinds[(k+r)%len(cpuKinds)]
			if kind.rx && !kind.testpmd && b.agent == nil {
				continue // lanekit-vhost receives from the wire only through the agent's sockets
			}
			if ctx.Err() != nil {
				return
			}
			run, err := b.measureCPU(ctx, guest, kind.name, kind.rx, kind.testpmd)
			if err == nil {
				err = run.check()
			}
			msg := ""
			if err != nil {
				rep.Errors = append(rep.Errors, fmt.Sprintf("cpu rep %d %s: %v", r+1, kind.name, err))
				msg = "error: " + err.Error()
			} else {
				vals[kind.name] = append(vals[kind.name], run)
				msg = fmt.Sprintf("%.0f frames/s (%.1f%% of offered), CPU %.1f%%, %.0f ns/frame, busy %.0f ns/frame", run.pps(),
					100*run.delivered(), 100*run.share(), run.nsPerFrame(), run.busyNs)
			}
			b.o.progress("vm backend cpu rep %d/%d %-17s %s", r+1, b.o.Repeat, kind.name, msg)
		}
	}
	rep.CPU = &BackendCPU{OfferedPPS: cpuRate, Size: cpuSize, Setup: fmt.Sprintf(cpuSetupNote, cpuRate, cpuSize),
		GuestToWire: cpuDirection(vals["lanekit_vhost_tx"], vals["testpmd_tx"]),
		WireToGuest: cpuDirection(vals["lanekit_vhost_rx"], vals["testpmd_rx"])}
}

// findExample returns explicit, else NAME in VhostBin's directory (make
// build's bin/), else cargo's examples/EXAMPLE there.
func findExample(vhostBin, name, example, explicit string) string {
	if explicit != "" {
		return explicit
	}
	p := filepath.Join(filepath.Dir(vhostBin), name)
	if _, err := os.Stat(p); err != nil {
		p = filepath.Join(filepath.Dir(vhostBin), "examples", example)
	}
	return p
}

// measureCPU runs one backend under the paced load and measures its CPU.
func (b *backendBench) measureCPU(ctx context.Context, guestBin, name string, rx, testpmd bool) (cpuRun, error) {
	life := b.o.Duration + cpuWarmup + backendReady + backendSlack
	sock := filepath.Join(b.dir, name+".sock")
	os.Remove(sock)
	defer os.Remove(sock)
	wire, comm := bfPeer, "lanekit-vhost"
	metrics := filepath.Join(b.dir, "metrics.sock")
	os.Remove(metrics)
	defer os.Remove(metrics)
	var argv []string
	switch {
	case testpmd:
		comm = "dpdk-testpmd"
		argv = []string{"ip", "netns", "exec", b.ns, "nice", "-n", cpuNice, "stdbuf", "-oL", "-eL", b.o.Testpmd,
			"--lcores", "0@1,1@1", "--no-huge", "-m", "512", "--no-pci", "--file-prefix", b.prefixes[1],
			"--vdev", "net_vhost0,iface=" + sock + ",queues=1",
			"--vdev", "net_af_xdp0,iface=" + bfVeth + ",start_queue=0,queue_count=1,busy_budget=0", "--",
			"--total-num-mbufs=16384", "--forward-mode=io", "--stats-period", "0", "--record-core-cycles"}
	case rx:
		wire = bfVMWir
		argv = []string{"ip", "netns", "exec", b.ns, "nice", "-n", cpuNice, "taskset", "-c", "1", b.o.VhostBin,
			"--xsk-socket", b.agent.sock, "--vm", benchVMName, "--mac", benchVMMAC.String(),
			"--socket", sock, "--poll-us", "0", "--metrics-listen", metrics}
	default:
		argv = []string{"ip", "netns", "exec", b.ns, "nice", "-n", cpuNice, "taskset", "-c", "1", b.o.VhostBin,
			"--ifname", bfVeth, "--socket", sock, "--poll-us", "0", "--metrics-listen", metrics}
	}
	be, err := b.startBackend(ctx, life, name, sock, argv)
	if err != nil {
		return cpuRun{}, err
	}
	stopped := false
	stopBackend := func() {
		if stopped {
			return
		}
		stopped = true
		if testpmd {
			be.stop(2 * time.Second)
		} else {
			be.term(2 * time.Second)
		}
	}
	defer stopBackend()
	pid := be.cmd.Process.Pid
	if c, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err != nil || strings.TrimSpace(string(c)) != comm {
		return cpuRun{}, fmt.Errorf("backend pid %d is %q, not %s (%v)", pid, strings.TrimSpace(string(c)), comm, err)
	}
	mode := "tx"
	if rx {
		mode = "rx"
	}
	// The guest refills its 256 receive buffers every ~50 µs round; at real-time priority a busy CPU 0
	// cannot delay it past a full ring (testpmd would then drop what the guest had no room for).
	g, err := startProc(ctx, life, "paced_guest", "chrt", "-f", "1", "taskset", "-c", "0", guestBin, "--socket", sock, "--mode", mode,
		"--rate", strconv.Itoa(cpuRate), "--size", strconv.Itoa(cpuSize), "--report-ms", "10",
		"--duration", strconv.FormatFloat((life-backendReady).Seconds(), 'f', 0, 64), "--stdin-stop")
	if err != nil {
		return cpuRun{}, err
	}
	defer g.stop(2 * time.Second)
	var guestFrames atomic.Uint64
	ready := make(chan struct{})
	go func() {
		once := false
		for l := range g.lines {
			if !once && strings.Contains(l, "ready") {
				once = true
				close(ready)
			}
			if n, ok := strings.CutPrefix(l, "frames "); ok {
				if v, err := strconv.ParseUint(strings.TrimSpace(n), 10, 64); err == nil {
					guestFrames.Store(v)
				}
			}
		}
	}()
	select {
	case <-ready:
	case <-g.done:
		return cpuRun{}, fmt.Errorf("paced_guest exited (%v): %s", g.err, g.log.last())
	case <-time.After(backendReady):
		return cpuRun{}, fmt.Errorf("paced_guest: not ready after %s: %s", backendReady, g.log.last())
	}
	// offered and delivered counters for the direction.
	var offered, delivered func() (uint64, error)
	if rx {
		gen, err := startPacedSender("/run/netns/"+b.ns, wire, wireFrame(benchVMMAC, cpuSize), cpuRate, 0)
		if err != nil {
			return cpuRun{}, err
		}
		defer gen.stop()
		offered = func() (uint64, error) { return gen.sent.Load(), gen.failed() }
		delivered = func() (uint64, error) { return guestFrames.Load(), nil }
	} else {
		h, err := netlinkHandle(b.ns)
		if err != nil {
			return cpuRun{}, err
		}
		defer h.Close()
		offered = func() (uint64, error) { return guestFrames.Load(), nil }
		delivered = func() (uint64, error) { return linkRxPackets(h, wire) }
	}
	select {
	case <-ctx.Done():
		return cpuRun{}, ctx.Err()
	case <-time.After(cpuWarmup):
	}
	type sample struct {
		off, del uint64
		cpu      time.Duration
		busy     float64 // lanekit-vhost: busy seconds
		t        time.Time
	}
	take := func() (sample, error) {
		var s sample
		var err error
		if s.off, err = offered(); err != nil {
			return s, err
		}
		if s.del, err = delivered(); err != nil {
			return s, err
		}
		if s.cpu, err = processCPU(pid); err != nil {
			return s, err
		}
		s.t = time.Now()
		if !testpmd {
			s.busy, err = BackendBusySeconds(ctx, metrics)
		}
		return s, err
	}
	s0, err := take()
	if err != nil {
		return cpuRun{}, err
	}
	select {
	case <-ctx.Done():
		return cpuRun{}, ctx.Err()
	case <-be.done:
		return cpuRun{}, fmt.Errorf("%s exited during the window (%v): %s", name, be.err, be.log.last())
	case <-g.done:
		return cpuRun{}, fmt.Errorf("paced_guest exited during the window (%v): %s", g.err, g.log.last())
	case <-time.After(b.o.Duration):
	}
	s1, err := take()
	if err != nil {
		return cpuRun{}, err
	}
	run := cpuRun{frames: s1.del - s0.del, offered: s1.off - s0.off, cpu: s1.cpu - s0.cpu, window: s1.t.Sub(s0.t)}
	if run.frames > 0 {
		run.busyNs = (s1.busy - s0.busy) * 1e9 / float64(run.frames)
	}
	if testpmd {
		stopBackend() // testpmd prints its cycle accounting when forwarding stops
		line := be.log.find("CPU cycles/packet=")
		if run.busyNs, err = ParseTestpmdCycles(line); err != nil {
			return run, fmt.Errorf("testpmd --record-core-cycles: %w", err)
		}
	}
	return run, nil
}

// testpmdCycles matches testpmd's cycle accounting line (22.11: "total
// cycles", later releases: "busy cycles").
var testpmdCycles = regexp.MustCompile(`CPU cycles/packet=([0-9.]+) \((?:total|busy) cycles=\d+ / total \S+ packets=(\d+)\) at (\d+) MHz`)

// ParseTestpmdCycles turns testpmd's "CPU cycles/packet=…" line into ns per
// packet (cycles at the TSC frequency it prints).
func ParseTestpmdCycles(line string) (float64, error) {
	m := testpmdCycles.FindStringSubmatch(line)
	if m == nil {
		return 0, fmt.Errorf("no cycles/packet line (%q)", line)
	}
	cyc, err1 := strconv.ParseFloat(m[1], 64)
	pkts, err2 := strconv.ParseUint(m[2], 10, 64)
	mhz, err3 := strconv.ParseFloat(m[3], 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return 0, err
	}
	if pkts == 0 || mhz == 0 {
		return 0, fmt.Errorf("no packets or clock in %q", line)
	}
	return cyc / mhz * 1e3, nil
}

// processCPU is the run time of all of pid's threads: the first field of
// /proc/PID/task/*/schedstat (ns), or utime+stime of task/*/stat (clock
// ticks) where schedstat is missing.
func processCPU(pid int) (time.Duration, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	if err != nil || len(tasks) == 0 {
		return 0, fmt.Errorf("process %d: no tasks (%v)", pid, err)
	}
	var total time.Duration
	for _, t := range tasks {
		if b, err := os.ReadFile(filepath.Join(t, "schedstat")); err == nil {
			d, err := ParseSchedstat(string(b))
			if err != nil {
				return 0, err
			}
			total += d
			continue
		}
		b, err := os.ReadFile(filepath.Join(t, "stat"))
		if err != nil {
			continue // the thread ended
		}
		u, st, err := ParseStatTimes(string(b), 100)
		if err != nil {
			return 0, err
		}
		total += u + st
	}
	return total, nil
}

// ParseSchedstat reads the run time (ns) from /proc/.../schedstat.
func ParseSchedstat(s string) (time.Duration, error) {
	f := strings.Fields(s)
	if len(f) != 3 {
		return 0, fmt.Errorf("schedstat %q: want 3 fields", s)
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("schedstat %q: %w", s, err)
	}
	return time.Duration(ns), nil
}

// ParseStatTimes reads utime and stime (fields 14 and 15, clock ticks of
// 1/hz s) from /proc/.../stat, whose second field (comm) may hold spaces and
// parentheses.
func ParseStatTimes(s string, hz int) (user, sys time.Duration, err error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("stat %q: no comm", s)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("stat: %d fields after comm", len(f))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, fmt.Errorf("stat: %w", err)
	}
	tick := time.Second / time.Duration(hz)
	return time.Duration(ut) * tick, time.Duration(st) * tick, nil
}

// cpuSplit is a process's user and kernel time over a window.
type cpuSplit struct {
	user, sys, window time.Duration
}

func (c cpuSplit) total() time.Duration { return c.user + c.sys }

// processTimes sums utime and stime over pid's threads (the kernel's tick
// accounting: softirq work it runs in the thread's context is system time
// unless the kernel accounts IRQ time apart).
func processTimes(pid int) (cpuSplit, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(tasks) == 0 {
		return cpuSplit{}, fmt.Errorf("process %d: no tasks (%v)", pid, err)
	}
	var c cpuSplit
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // the thread ended
		}
		u, st, err := ParseStatTimes(string(b), 100)
		if err != nil {
			return c, err
		}
		c.user += u
		c.sys += st
	}
	return c, nil
}

// splitValues collects the guest→wire saturation runs' splits by kind and
// frame size.
type splitValues map[string]map[int][]cpuSplit

func (v splitValues) add(kind string, size int, c cpuSplit) {
	if v[kind] == nil {
		v[kind] = map[int][]cpuSplit{}
	}
	v[kind][size] = append(v[kind][size], c)
}

// BackendTimeSplit is where a backend's core time went while it forwarded
// guest→wire at saturation: CPUShare of a core in all, UserShare of that in
// the backend's own code (the rest in the kernel: for AF_XDP copy mode on a
// veth, the transmit copy into an skb and the peer's receive).
type BackendTimeSplit struct {
	Kind      string  `json:"kind"`
	Size      int     `json:"size"`
	CPUShare  Summary `json:"cpu_share"`
	UserShare Summary `json:"user_share"`
}

func (v splitValues) summary() []BackendTimeSplit {
	var out []BackendTimeSplit
	for _, kind := range []string{kindOwn, kindTestpmd, kindRealTX} {
		for _, size := range []int{64, frameSize1500} {
			cs := v[kind][size]
			if len(cs) == 0 {
				continue
			}
			var share, user []float64
			for _, c := range cs {
				share = append(share, c.total().Seconds()/c.window.Seconds())
				user = append(user, c.user.Seconds()/c.total().Seconds())
			}
			out = append(out, BackendTimeSplit{Kind: kind, Size: size, CPUShare: Summarize(share), UserShare: Summarize(user)})
		}
	}
	return out
}

func netlinkHandle(ns string) (*netlink.Handle, error) {
	n, err := netns.GetFromPath("/run/netns/" + ns)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", ns, err)
	}
	defer n.Close()
	h, err := netlink.NewHandleAt(n)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", ns, err)
	}
	return h, nil
}

func linkRxPackets(h *netlink.Handle, dev string) (uint64, error) {
	l, err := h.LinkByName(dev)
	if err != nil {
		return 0, fmt.Errorf("link %s: %w", dev, err)
	}
	if l.Attrs().Statistics == nil {
		return 0, fmt.Errorf("link %s: no statistics", dev)
	}
	return l.Attrs().Statistics.RxPackets, nil
}

// wireFrame is a size-byte IPv4/UDP frame to dst (what the wire would carry
// to the VM).
func wireFrame(dst net.HardwareAddr, size int) []byte {
	f := make([]byte, size)
	copy(f[0:6], dst)
	copy(f[6:12], net.HardwareAddr{0x02, 0x6c, 0x6b, 0, 0, 0x02})
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:34]
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(size-14))
	copy(ip[12:16], net.IPv4(10, 99, 0, 2).To4())
	copy(ip[16:20], net.IPv4(10, 99, 0, 1).To4())
	binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip))
	udp := f[34:42]
	binary.BigEndian.PutUint16(udp[0:], 4321)
	binary.BigEndian.PutUint16(udp[2:], 9)
	binary.BigEndian.PutUint16(udp[4:], uint16(size-34))
	return f
}

func ipChecksum(h []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(h); i += 2 {
		s += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

// pacedSender writes a frame on a device at a fixed rate from a thread pinned
// to one CPU, in rounds of about 50 µs (the frames due since the start).
type pacedSender struct {
	sent atomic.Uint64
	quit atomic.Bool
	done chan struct{}
	err  error
}

func (p *pacedSender) failed() error {
	select {
	case <-p.done:
		if p.err != nil {
			return p.err
		}
		return errors.New("paced sender stopped")
	default:
		return nil
	}
}

func (p *pacedSender) stop() {
	p.quit.Store(true)
	<-p.done
}

// startPacedSender opens an AF_PACKET socket on dev in the netns at nsPath
// and sends frame rate times a second from a thread pinned to cpu.
func startPacedSender(nsPath, dev string, frame []byte, rate, cpu int) (*pacedSender, error) {
	var fd int
	var sa *unix.SockaddrLinklayer
	err := netdev.InNetns(nsPath, func() error {
		ifc, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		sa = &unix.SockaddrLinklayer{Ifindex: ifc.Index, Halen: 6}
		copy(sa.Addr[:], frame[:6])
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("paced sender on %s: %w", dev, err)
	}
	p := &pacedSender{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		defer unix.Close(fd)
		// The pinned thread is never handed back: it exits with the goroutine.
		runtime.LockOSThread()
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			p.err = fmt.Errorf("paced sender: pin to CPU %d: %w", cpu, err)
			return
		}
		nice, _ := strconv.Atoi(cpuNice)
		if err := unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), nice); err != nil {
			p.err = fmt.Errorf("paced sender: nice %d: %w", nice, err)
			return
		}
		start := time.Now()
		var sent uint64
		var skipped uint64 // frames a stalled thread did not send (the bucket holds cpuBurst)
		for !p.quit.Load() {
			due := uint64(time.Since(start).Seconds()*float64(rate)) - skipped
			if due > sent+cpuBurst {
				skipped += due - sent - cpuBurst
				due = sent + cpuBurst
			}
			for ; sent < due; sent++ {
				if err := unix.Sendto(fd, frame, 0, sa); err != nil && !errors.Is(err, unix.ENOBUFS) {
					p.err = fmt.Errorf("paced sender on %s: %w", dev, err)
					return
				}
			}
			p.sent.Store(sent)
			_ = unix.Nanosleep(&unix.Timespec{Nsec: 50_000}, nil)
		}
	}()
	return p, nil
}

// BackendBusySeconds scrapes lanekit_vhost_busy_seconds_total from a
// lanekit-vhost metrics socket, summed over queue pairs.
func BackendBusySeconds(ctx context.Context, sock string) (float64, error) {
	text, err := scrapeBackend(ctx, sock)
	if err != nil {
		return 0, err
	}
	return backendBusy(text)
}

func backendBusy(text string) (float64, error) {
	sum, n, err := sumCounter(text, "lanekit_vhost_busy_seconds_total")
	if err == nil && n == 0 {
		err = errors.New("backend metrics: no lanekit_vhost_busy_seconds_total")
	}
	return sum, err
}
