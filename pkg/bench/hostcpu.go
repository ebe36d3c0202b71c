package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Host CPU per byte and per transaction of the guest rows (issue 37): what a
// VM host pays for a VM's traffic whatever the guest does. Measured at a
// fixed offered load, the same for every guest row, so the rows are compared
// at equal work: all CPU time the machine spent (its CPUs' wall time minus
// their idle time, /proc/stat) minus the time of the lab guests' vCPU threads
// (QEMU's "CPU n/TCG" or "CPU n/KVM" threads, named with debug-threads=on).
// What remains is the backend (lanekit-vhost or QEMU's own virtio-net and
// tap I/O), QEMU's main loop, the client, softirq and every kernel path in
// between. It is machine-wide: other work on the machine counts too, so the
// figures mean something only on a quiet machine (the table says so).

// userHZ is the unit of /proc/stat (USER_HZ, 100 on Linux).
const userHZ = 100

// DefaultCPUTCPMbps is the fixed TCP rate of the host CPU per byte. The
// host CPU per transaction is measured closed-loop (one transaction in
// flight, as the RR metric): sockperf's own pacing (--mps) busy-waits,
// which would be counted as host CPU.
const (
	DefaultCPUTCPMbps = 200
)

// cpuTimes is a snapshot of the machine's idle time (all CPUs), the
// guests' vCPU threads' run time, the parts' run time and the wall clock.
type cpuTimes struct {
	idle, vcpu time.Duration
	parts      map[string]time.Duration
	at         time.Time
}

// ParseProcStatIdle returns the time no task ran, of the aggregate "cpu"
// line of a /proc/stat text: idle + iowait + steal. Busy time is the wall
// time of every CPU minus this: the kernel keeps idle time exactly (NOHZ
// idle accounting) where its per-state busy columns are tick samples.
func ParseProcStatIdle(stat []byte) (time.Duration, error) {
	line, _, _ := bytes.Cut(stat, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: first line %q is not the cpu total", line)
	}
	var idle uint64
	for _, i := range []int{4, 5, 8} { // idle iowait steal
		v, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: field %d: %w", i, err)
		}
		idle += v
	}
	return time.Duration(idle) * (time.Second / userHZ), nil
}

// IsVCPUThread reports whether a QEMU thread name (comm) is a vCPU's.
func IsVCPUThread(comm string) bool {
	comm = strings.TrimSpace(comm)
	return strings.HasPrefix(comm, "CPU ") && (strings.HasSuffix(comm, "/TCG") || strings.HasSuffix(comm, "/KVM"))
}

// vcpuTime sums the run time (schedstat) of the vCPU threads of the QEMU
// processes pids. A QEMU without named vCPU threads is an error: its vCPU
// time could not be told apart.
func vcpuTime(pids []int) (time.Duration, error) {
	var total time.Duration
	for _, pid := range pids {
		d, n, err := threadRunTime(pid, IsVCPUThread)
		if err != nil {
			return 0, fmt.Errorf("guest QEMU: %w", err)
		}
		if n == 0 {
			return 0, fmt.Errorf("guest QEMU pid %d has no named vCPU threads (started without -name ...,debug-threads=on)", pid)
		}
		total += d
	}
	return total, nil
}

// runTimeExceptVCPUs is the run time of every thread of process pid but
// its vCPU threads.
func runTimeExceptVCPUs(pid int) (time.Duration, error) {
	d, _, err := threadRunTime(pid, func(comm string) bool { return !IsVCPUThread(comm) })
	return d, err
}

// threadRunTime sums the run time (schedstat) of the threads of process
// pid whose name pick takes, and says how many there were.
func threadRunTime(pid int, pick func(comm string) bool) (time.Duration, int, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	if err != nil || len(tasks) == 0 {
		return 0, 0, fmt.Errorf("process %d: no threads (gone?)", pid)
	}
	var total time.Duration
	n := 0
	for _, t := range tasks {
		comm, err := os.ReadFile(filepath.Join(t, "comm"))
		if err != nil || !pick(string(comm)) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(t, "schedstat"))
		if err != nil {
			continue // the thread ended
		}
		d, err := ParseSchedstat(string(b))
		if err != nil {
			return 0, 0, err
		}
		total += d
		n++
	}
	return total, n, nil
}

func readCPUTimes(guestPIDs []int, parts []CPUPart) (cpuTimes, error) {
	vcpu, err := vcpuTime(guestPIDs)
	if err != nil {
		return cpuTimes{}, err
	}
	pt := map[string]time.Duration{}
	for _, p := range parts {
		d, err := runTimeExceptVCPUs(p.PID)
		if err != nil {
			return cpuTimes{}, fmt.Errorf("%s: %w", p.Name, err)
		}
		pt[p.Name] += d
	}
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}, err
	}
	at := time.Now()
	idle, err := ParseProcStatIdle(stat)
	if err != nil {
		return cpuTimes{}, err
	}
	return cpuTimes{idle: idle, vcpu: vcpu, parts: pt, at: at}, nil
}

// hostCPUDuring runs f and returns the host CPU time (every CPU's busy time
// minus the guests' vCPUs) spent while it ran, and each part's.
func hostCPUDuring(guestPIDs []int, parts []CPUPart, f func() error) (time.Duration, map[string]time.Duration, error) {
	if len(guestPIDs) == 0 {
		return 0, nil, errors.New("host CPU: the guests' QEMU pids are unknown")
	}
	before, err := readCPUTimes(guestPIDs, parts)
	if err != nil {
		return 0, nil, fmt.Errorf("host CPU: %w", err)
	}
	if err := f(); err != nil {
		return 0, nil, err
	}
	after, err := readCPUTimes(guestPIDs, parts)
	if err != nil {
		return 0, nil, fmt.Errorf("host CPU: %w", err)
	}
	pd := map[string]time.Duration{}
	for name, d := range after.parts {
		pd[name] = max(d-before.parts[name], 0)
	}
	return hostCPU(before, after, runtime.NumCPU()), pd, nil
}

// hostCPU is the busy time between two snapshots (the CPUs' wall time minus
// their idle time) less the vCPU threads' run time; never below zero (the
// idle column has 10 ms steps).
func hostCPU(before, after cpuTimes, cpus int) time.Duration {
	busy := time.Duration(cpus)*after.at.Sub(before.at) - (after.idle - before.idle)
	return max(busy-(after.vcpu-before.vcpu), 0)
}

// ParseIperf3Bytes returns the bytes the receiver of an iperf3 -J run got
// (end.sum_received.bytes).
func ParseIperf3Bytes(data []byte) (int64, error) {
	var rep struct {
		Error string `json:"error"`
		End   struct {
			SumReceived *struct {
				Bytes int64 `json:"bytes"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		return 0, fmt.Errorf("parse iperf3 json: %w", err)
	}
	if rep.Error != "" {
		return 0, fmt.Errorf("iperf3: %s", rep.Error)
	}
	if rep.End.SumReceived == nil || rep.End.SumReceived.Bytes <= 0 {
		return 0, errors.New("parse iperf3 json: no end.sum_received.bytes")
	}
	return rep.End.SumReceived.Bytes, nil
}

// hostCPURun is one fixed-load run of a guest row's client, measured: its
// output, the host CPU it cost and each part's share, and the interrupts the
// guest's NIC took meanwhile (irqsOK false when they could not be read).
type hostCPURun struct {
	out    []byte
	host   time.Duration
	parts  map[string]time.Duration
	irqs   uint64
	irqsOK bool
}

// measureHostCPU runs the client args of p in its netns and measures it,
// reading the guest's NIC interrupts before and after (outside the CPU
// window).
func measureHostCPU(ctx context.Context, o Options, p Path, args []string) (hostCPURun, error) {
	var r hostCPURun
	irq0, ok0 := guestIRQs(ctx, o, p)
	var err error
	r.host, r.parts, err = hostCPUDuring(o.GuestPIDs, p.CPUParts, func() error {
		var err error
		r.out, err = runIn(ctx, o.Duration+15*time.Second, p.ClientNS, args...)
		return err
	})
	if err != nil {
		return r, err
	}
	irq1, ok1 := guestIRQs(ctx, o, p)
	r.irqs, r.irqsOK = irqDelta(irq0, irq1, ok0, ok1)
	return r, nil
}

// irqsPer is the run's guest NIC interrupts per unit (per units in the run),
// NaN when they were not counted.
func (r hostCPURun) irqsPer(per float64) float64 {
	if !r.irqsOK || per <= 0 {
		return math.NaN()
	}
	return float64(r.irqs) / per
}

// cpuTCP measures host CPU ns per byte of single-stream TCP at
// o.CPUTCPMbps (reverse: the guest sends).
func cpuTCP(ctx context.Context, o Options, p Path, reverse bool, into, irqInto []float64, parts map[string][]float64, cur int) error {
	srv, args, err := startIperf(ctx, o, p, reverse, "-b", strconv.Itoa(o.cpuTCPMbps())+"M")
	if err != nil {
		return err
	}
	defer srv.stop()
	run, err := measureHostCPU(ctx, o, p, args)
	if err != nil {
		return err
	}
	n, err := ParseIperf3Bytes(run.out)
	if err != nil {
		return err
	}
	per := float64(n) // ns per byte
	into[cur] = float64(run.host.Nanoseconds()) / per
	irqInto[cur] = run.irqsPer(per / 1e6) // per MB
	recordParts(parts, run.parts, per, len(into), cur)
	return nil
}

// runCPUTCP: host CPU per byte, client -> guest, at the fixed rate.
func runCPUTCP(ctx context.Context, o Options, p Path, s *samples) error {
	return cpuTCP(ctx, o, p, false, s.cpuByte, s.irqMB, s.partMap(&s.cpuPartByte), s.cur)
}

// runCPUTCPRev: host CPU per byte, guest -> client, at the fixed rate.
func runCPUTCPRev(ctx context.Context, o Options, p Path, s *samples) error {
	return cpuTCP(ctx, o, p, true, s.cpuByteRev, s.irqMBRev, s.partMap(&s.cpuPartByteRev), s.cur)
}

// runCPURR: host CPU µs per request/response transaction, closed loop (one
// in flight), without the busy-CPU spinners (they would be counted as busy).
func runCPURR(ctx context.Context, o Options, p Path, s *samples) error {
	srv, args, err := startSockperf(ctx, o, p)
	if err != nil {
		return err
	}
	defer srv.stop()
	run, err := measureHostCPU(ctx, o, p, args)
	if err != nil {
		return err
	}
	lat, err := ParseSockperf(run.out)
	if err != nil {
		return err
	}
	if lat.Observations <= 0 {
		return errors.New("sockperf: no observations counted")
	}
	per := 1e3 * float64(lat.Observations) // µs per transaction
	s.cpuTxn[s.cur] = float64(run.host.Nanoseconds()) / per
	s.irqTxn[s.cur] = run.irqsPer(per / 1e3) // per transaction
	recordParts(s.partMap(&s.cpuPartTxn), run.parts, per, len(s.cpuTxn), s.cur)
	return nil
}

// recordParts stores each part's run time in pd divided by per as
// repetition cur of its values in parts.
func recordParts(parts map[string][]float64, pd map[string]time.Duration, per float64, repeat, cur int) {
	for name, d := range pd {
		partSlot(parts, name, repeat)[cur] = float64(d.Nanoseconds()) / per
	}
}

// partMap returns *m, made on first use.
func (s *samples) partMap(m *map[string][]float64) map[string][]float64 {
	if *m == nil {
		*m = map[string][]float64{}
	}
	return *m
}

// partSlot returns the per-repetition values of part name (NaN: not
// measured), made on first use.
func partSlot(m map[string][]float64, name string, repeat int) []float64 {
	xs, ok := m[name]
	if !ok {
		xs = make([]float64, repeat)
		for i := range xs {
			xs[i] = math.NaN()
		}
		m[name] = xs
	}
	return xs
}

func (o Options) cpuTCPMbps() int {
	if o.CPUTCPMbps > 0 {
		return o.CPUTCPMbps
	}
	return DefaultCPUTCPMbps
}

// writeHostCPU prints the guest rows' host CPU figures and, when both guest
// rows ran, their per-repetition ratios.
func (r *Report) writeHostCPU(w io.Writer) {
	var note string
	for _, row := range r.Rows {
		hc := row.HostCPU
		if hc == nil {
			continue
		}
		note = hc.MachineWideNote
		fmt.Fprintf(w, "host CPU (%s): %s ns/byte to the guest and %s ns/byte from it at %d Mbit/s, %s µs/transaction (RR, one in flight)\n",
			row.Path, spread(hc.NsPerByte, "%.2f"), spread(hc.NsPerByteRev, "%.2f"), hc.TCPMbps,
			spread(hc.UsPerTxn, "%.1f"))
		for _, part := range hc.Parts {
			fmt.Fprintf(w, "  of which %s: %s ns/byte to the guest, %s from it, %s µs/transaction\n", part.Name,
				spread(part.NsPerByte, "%.2f"), spread(part.NsPerByteRev, "%.2f"), spread(part.UsPerTxn, "%.1f"))
		}
		if len(hc.Parts) > 0 {
			fmt.Fprintln(w, "  the rest: the kernel (softirq, the path between client and guest), the client, other work on the machine")
		}
		writeGuestIRQs(w, hc)
	}
	if note == "" {
		return
	}
	fmt.Fprintf(w, "host CPU: %s\n", note)
	lk, tap := r.row(VMPath), r.row(TapVMPath)
	if lk == nil || tap == nil || lk.HostCPU == nil || tap.HostCPU == nil {
		return
	}
	if s := pairedRatio(lk.Reps.CPUUsPerTxn, tap.Reps.CPUUsPerTxn); s != nil {
		fmt.Fprintf(w, "host CPU per transaction %s / %s: %.2f × (%.2f–%.2f)\n", VMPath, TapVMPath, s.Median, s.Min, s.Max)
	}
}
