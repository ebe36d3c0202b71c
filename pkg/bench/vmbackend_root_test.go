package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestBackendCompareRoot runs the real comparison once (1 s windows) and
// checks both backends moved frames and nothing is left behind: no netns, no
// DPDK runtime files, no processes.
func TestBackendCompareRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (netns, AF_XDP)")
	}
	if testing.Short() {
		t.Skip("runs DPDK testpmd: skipped with -short")
	}
	if _, err := exec.LookPath("dpdk-testpmd"); err != nil {
		t.Skip("dpdk-testpmd not installed")
	}
	bin := os.Getenv("LANEKIT_VHOST")
	if bin == "" {
		bin, _ = filepath.Abs("../../bin/lanekit-vhost")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("lanekit-vhost not built (%s): make build", bin)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var log strings.Builder
	rep, err := RunBackendCompare(ctx, BackendOptions{VhostBin: bin, Duration: time.Second, Repeat: 1, Progress: &log})
	t.Log(log.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Errors) > 0 {
		t.Fatalf("errors: %v", rep.Errors)
	}
	for name, m := range map[string]BackendMetric{"pps_64": rep.PPS64, "gbps_1500": rep.Gbps1500} {
		if m.LanekitVhost.Median <= 0 || m.Testpmd.Median <= 0 || m.Ratio == nil || *m.Ratio <= 0 {
			t.Errorf("%s: %+v", name, m)
		}
	}
	if _, err := os.Stat("/run/netns/lk-vhb-" + itoa(os.Getpid())); err == nil {
		t.Error("netns left behind")
	}
	for _, p := range []string{"lkbf", "lkbb"} {
		if _, err := os.Stat(filepath.Join(dpdkRuntimeRoot, p+itoa(os.Getpid()))); err == nil {
			t.Errorf("DPDK runtime dir %s left behind", p)
		}
	}
	out, _ := exec.Command("pgrep", "-f", benchDirPrefix(os.Getpid())).Output()
	if len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("processes left behind: %s", out)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
