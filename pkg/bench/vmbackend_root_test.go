package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/testutil"
)

// TestBackendCompareRoot runs the real comparison once (1 s windows) and
// checks every row moved frames, the agent rows took the agent's path
// (steer_vm on the VM device, its endpoint counters saw the probe, socket
// handovers, every frame the guest counted came from the agent's sockets),
// and nothing is left behind: no netns, pins, DPDK runtime files, processes.
func TestBackendCompareRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (netns, AF_XDP, BPF)")
	}
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs (frontend and backend pinned apart)")
	}
	testutil.RequireBPFFS(t)
	if testing.Short() {
		t.Skip("runs DPDK testpmd: skipped with -short")
	}
	testutil.RequireBinary(t, "dpdk-testpmd")
	bin := os.Getenv("LANEKIT_VHOST")
	if bin == "" {
		bin, _ = filepath.Abs("../../bin/lanekit-vhost")
	}
	if _, err := os.Stat(bin); err != nil {
		testutil.MissingDep(t, "lanekit-vhost not built (%s)", bin)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var log strings.Builder
	rep, err := RunBackendCompare(ctx, BackendOptions{VhostBin: bin, Duration: time.Second, Repeat: 1, Progress: &log})
	t.Log(log.String())
	if err != nil {
		t.Fatal(err)
	}
	// A paced source that a busy machine kept below its rate loses that CPU
	// run (the row needs the fixed load); anything else is a failure.
	var lost []string
	for _, e := range rep.Errors {
		if strings.Contains(e, "did not keep the rate (busy machine)") {
			lost = append(lost, e)
			continue
		}
		t.Errorf("error: %s", e)
	}
	if t.Failed() {
		t.FailNow()
	}
	// CPU per frame: every direction has both backends, with process and busy
	// time per frame, the offered load delivered, and the three ratios.
	if rep.CPU == nil {
		t.Fatal("no cpu_per_frame")
	}
	for name, d := range map[string]*CPUDirection{"guest->wire": rep.CPU.GuestToWire, "wire->guest": rep.CPU.WireToGuest} {
		if len(lost) > 0 && (d == nil || d.Ratio == nil) {
			t.Logf("%s cpu rows incomplete on a busy machine: %v", name, lost)
			continue
		}
		if d == nil || d.Ratio == nil || d.ProcessRatio == nil || d.ConservativeRatio == nil {
			t.Fatalf("%s: cpu rows %+v", name, d)
		}
		for who, side := range map[string]CPUSide{"lanekit-vhost": d.LanekitVhost, "testpmd": d.Testpmd} {
			if side.NsPerFrame.Median <= 0 || side.BusyNsPerFrame.Median <= 0 || side.DeliveredShare.Median < cpuMinShare ||
				side.DeliveredPPS.Median < cpuMinRate*cpuMinShare*cpuRate {
				t.Errorf("%s %s: %+v", name, who, side)
			}
		}
		// testpmd busy-polls: its process takes most of its core at any
		// offered load, as much of one as the machine leaves it (a load
		// average above the CPU count shares each core).
		floor := 0.5
		if l := max(rep.LoadAvg[0], rep.LoadAvg[1]); l > float64(runtime.NumCPU()) {
			floor *= float64(runtime.NumCPU()) / l
		}
		if d.Testpmd.CPUShare.Median < floor {
			t.Errorf("%s testpmd process CPU %.2f of a core (load average %.1f/%.1f): not busy polling?", name, d.Testpmd.CPUShare.Median, rep.LoadAvg[0], rep.LoadAvg[1])
		}
	}
	if len(rep.TimeSplit) == 0 || len(rep.Targets) != 4 {
		t.Errorf("time split %+v, targets %+v", rep.TimeSplit, rep.Targets)
	}
	if rep.GuestToWireReal == nil || rep.WireToGuestReal == nil || rep.PathCheck == nil {
		t.Fatalf("no agent-path rows: %+v", rep)
	}
	for name, m := range map[string]BackendMetric{
		"own pps_64": rep.PPS64, "own gbps_1500": rep.Gbps1500,
		"guest->wire agent pps_64": rep.GuestToWireReal.PPS64, "guest->wire agent gbps_1500": rep.GuestToWireReal.Gbps1500,
		"wire->guest agent pps_64": rep.WireToGuestReal.PPS64, "wire->guest agent gbps_1500": rep.WireToGuestReal.Gbps1500,
	} {
		if m.LanekitVhost.Median <= 0 || m.Testpmd.Median <= 0 || m.Ratio == nil || *m.Ratio <= 0 {
			t.Errorf("%s: %+v", name, m)
		}
	}
	c := rep.PathCheck
	t.Logf("path check: %+v", *c)
	if c.XDPProgram != "steer_vm" {
		t.Errorf("xdp program on %s: %q, want steer_vm", c.VMDevice, c.XDPProgram)
	}
	if c.ProbeSent == 0 || c.ProbeCounted != c.ProbeSent {
		t.Errorf("steer_vm counted %d of %d not-for-vm probes", c.ProbeCounted, c.ProbeSent)
	}
	// One handover per agent-path backend start: 2 kinds x 2 sizes.
	if c.Handovers < 4 {
		t.Errorf("%d socket handovers, want >= 4", c.Handovers)
	}
	if c.GuestRxFrames == 0 || c.BackendRxFrames < c.GuestRxFrames {
		t.Errorf("guest counted %d frames, lanekit-vhost took %d from the agent's sockets", c.GuestRxFrames, c.BackendRxFrames)
	}
	if _, err := os.Stat("/run/netns/lk-vhb-" + itoa(os.Getpid())); err == nil {
		t.Error("netns left behind")
	}
	if _, err := os.Stat("/sys/fs/bpf/lk-vhb-" + itoa(os.Getpid())); err == nil {
		t.Error("bpf pin dir left behind")
	}
	for _, p := range []string{"lkbf", "lkbb", "lkbg"} {
		if _, err := os.Stat(filepath.Join(dpdkRuntimeRoot, p+itoa(os.Getpid()))); err == nil {
			t.Errorf("DPDK runtime dir %s left behind", p)
		}
	}
	for _, pat := range []string{benchDirPrefix(os.Getpid()), "lkbg" + itoa(os.Getpid())} {
		out, _ := exec.Command("pgrep", "-f", pat).Output()
		if len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("processes left behind (%s): %s", pat, out)
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
