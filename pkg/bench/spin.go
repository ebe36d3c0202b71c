package bench

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// spinners are one busy process per CPU, each pinned to its CPU at
// SCHED_IDLE: they run only when nothing else wants the CPU, so the CPU never
// enters an idle state and RR latencies stop depending on idle-exit latency.
type spinners struct {
	procs []*proc
}

// spinnerArgs is the command of the spinner on cpu: chrt and taskset set the
// policy and the affinity before exec, so every thread of the spinning
// process inherits them.
func spinnerArgs(self string, cpu int, life time.Duration) []string {
	return []string{"chrt", "--idle", "0", "taskset", "-c", strconv.Itoa(cpu),
		self, "lab", "cpu-spin", "--for", life.String()}
}

// startSpinners starts one spinner per online CPU for at most life.
func startSpinners(ctx context.Context, self string, life time.Duration) (*spinners, error) {
	if self == "" {
		return nil, fmt.Errorf("busy cpus: lanekit executable unknown")
	}
	sp := &spinners{}
	for cpu := range runtime.NumCPU() {
		p, err := startProc(ctx, life, fmt.Sprintf("cpu-spin %d", cpu), spinnerArgs(self, cpu, life)...)
		if err != nil {
			sp.stop()
			return nil, fmt.Errorf("busy cpus: %w", err)
		}
		sp.procs = append(sp.procs, p)
	}
	// Wait until every spinner is pinned (taskset, the last step of its exec
	// chain, has run: chrt has set SCHED_IDLE before it), so measurements do
	// not start before the spinners are in place. A spinner that cannot set
	// its policy exits at once: say so rather than measure with idle CPUs.
	deadline := time.Now().Add(5 * time.Second)
	for cpu := 0; cpu < len(sp.procs); {
		p := sp.procs[cpu]
		select {
		case <-p.done:
			sp.stop()
			return nil, fmt.Errorf("busy cpus: %s exited: %v: %s", p.name, p.err, p.log.last())
		default:
		}
		var set unix.CPUSet
		if unix.SchedGetaffinity(p.cmd.Process.Pid, &set) == nil && set.Count() == 1 && set.IsSet(cpu) {
			cpu++
			continue
		}
		if time.Now().After(deadline) {
			sp.stop()
			return nil, fmt.Errorf("busy cpus: %s not pinned to CPU %d after 5s", p.name, cpu)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// One more look: a spinner that refuses its policy exits right after exec.
	time.Sleep(50 * time.Millisecond)
	for _, p := range sp.procs {
		select {
		case <-p.done:
			sp.stop()
			return nil, fmt.Errorf("busy cpus: %s exited: %v: %s", p.name, p.err, p.log.last())
		default:
		}
	}
	return sp, nil
}

func (sp *spinners) stop() {
	for _, p := range sp.procs {
		p.stop(100 * time.Millisecond)
	}
}

// Spin keeps the calling process's CPU busy for d (the body of the hidden
// `lab cpu-spin` command). It refuses to spin at a normal priority: only
// SCHED_IDLE spinning leaves the measured tools unaffected.
func Spin(d time.Duration) error {
	attr, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		return fmt.Errorf("cpu-spin: read scheduling policy: %w", err)
	}
	if attr.Policy != unix.SCHED_IDLE {
		return fmt.Errorf("cpu-spin: policy %d, want SCHED_IDLE (%d): start it with chrt --idle 0", attr.Policy, unix.SCHED_IDLE)
	}
	runtime.GOMAXPROCS(1)
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
	}
	return nil
}
