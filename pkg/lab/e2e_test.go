package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/bench"
)

// TestLabEndToEnd builds the lanekit CLI, brings up a full 2-node lab
// (agents, lanekit pods through the CNI plugin, baseline pods), proves the
// connectivity matrix, kills an agent with SIGKILL in the middle of an iperf3
// transfer (the transfer completes, the restarted agent re-adopts), runs a
// 1 × 1 s bench and tears everything down, asserting nothing is left. Root only.
func TestLabEndToEnd(t *testing.T) {
	bins := requireLabBins(t, "creates network namespaces", "ip", "iptables-restore", "nsenter", "iperf3", "sockperf", "sysctl")
	binDir := bins.Dir
	cli := CLIForTests(t)
	lk := func(t *testing.T, args ...string) (string, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, cli, args...)
		cmd.Env = append(os.Environ(), "LANEKIT_BIN="+binDir)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		t.Logf("lanekit %s:\n%s%s", strings.Join(args, " "), stdout.String(), stderr.String())
		return stdout.String(), err
	}
	assertGone := func(t *testing.T) {
		t.Helper()
		if left := listLabNetns(); len(left) > 0 {
			t.Errorf("lk- netns left behind: %v", left)
		}
		if _, err := os.Stat(RunDir); err == nil {
			t.Errorf("%s left behind", RunDir)
		}
		if d := bpfNodeDirs(); len(d) > 0 {
			t.Errorf("pins left behind: %v", d)
		}
		for _, d := range []string{BPFRoot, filepath.Dir(RunDir)} {
			if _, err := os.Stat(d); err == nil {
				t.Errorf("%s left behind", d)
			}
		}
	}
	t.Cleanup(func() {
		if _, err := lk(t, "lab", "down"); err != nil {
			t.Errorf("cleanup lab down: %v", err)
		}
		assertGone(t)
	})

	// The VM fast lane is part of the lab: a QEMU guest with 2 queue pairs on
	// node 2, served by lanekit-vhost over AF_XDP.
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Fatalf("qemu-system-x86_64 missing (make deps installs it): %v", err)
	}
	requireGuestImage(t)
	if _, err := lk(t, "lab", "up", "--nodes", "2", "--pods-per-node", "1", "--vm", "--vm-queues", "2"); err != nil {
		t.Fatalf("lab up: %v", err)
	}
	status, err := lk(t, "lab", "status")
	if err != nil {
		t.Fatalf("lab status: %v", err)
	}
	wantPods := []string{"lk-n1-b1", "lk-n2-b1", "lk-n1-p1", "lk-n2-p1", "vm1", "vm-std"}
	if strings.Count(status, "alive") != 2 {
		t.Errorf("want 2 live agents in status")
	}
	for _, p := range wantPods {
		if !strings.Contains(status, p) {
			t.Errorf("status lacks pod %s", p)
		}
	}
	out, err := lk(t, "lab", "check")
	if err != nil {
		t.Fatalf("lab check: %v", err)
	}
	if !strings.Contains(out, "all probes passed") || strings.Contains(out, "FAIL") {
		t.Errorf("lab check output does not prove the matrix")
	}
	for _, want := range []string{"nodes: ICMP + TCP echo to every VM", "lanekit VMs (commands through the guest console)",
		"baseline VMs (commands through the guest console)", "and every lanekit VM", "and every baseline VM"} {
		if !strings.Contains(out, want) {
			t.Errorf("lab check did not probe the VM (%q missing)", want)
		}
	}
	// The guest drives both queue pairs its device has.
	if out, err := lk(t, "lab", "vm-exec", "vm1", "--", "ethtool", "-l", "eth0"); err != nil ||
		!strings.Contains(strings.Join(strings.Fields(out), " "), "Current hardware settings: RX: n/a TX: n/a Other: n/a Combined: 2") {
		t.Errorf("guest does not run 2 combined queues: %v\n%s", err, out)
	}
	// vm-exec reaches the baseline guest too (lab status lists it; lab bench runs commands in it).
	if out, err := lk(t, "lab", "vm-exec", "vm-std", "--", "cat", "/sys/class/net/eth0/address"); err != nil ||
		!strings.HasPrefix(strings.TrimSpace(out), "52:54:00:") {
		t.Errorf("lab vm-exec vm-std: %v\n%s", err, out)
	}

	agentKilledDuringTransfer(t, bins, lk)
	vmAgentKilled(t, bins, lk)
	if out, err := lk(t, "lab", "check"); err != nil || !strings.Contains(out, "all probes passed") {
		t.Fatalf("lab check after the agent restart: %v", err)
	}

	chart := filepath.Join(t.TempDir(), "bench.png")
	// --vm-backend off: the backend comparison (DPDK testpmd against lanekit-vhost,
	// with the agent path) is pkg/bench's TestBackendCompareRoot; here the rows.
	out, err = lk(t, "lab", "bench", "--json", "--repeat", "1", "--duration", "1s", "--busy-cpus", "--vm-backend", "off", "--chart", chart)
	if err != nil {
		t.Fatalf("lab bench: %v", err)
	}
	var doc struct {
		Machine struct {
			Kernel string `json:"kernel"`
			Cores  int    `json:"cores"`
		} `json:"machine"`
		Rows []struct {
			Path string `json:"path"`
			TCP  struct {
				Median float64 `json:"median"`
			} `json:"tcp_gbps"`
			P50 float64 `json:"rr_p50_us"`
			P99 float64 `json:"rr_p99_us"`
			CPS float64 `json:"cps"`
			// Guest rows: the guest NIC's interrupts in the host CPU runs, read in the guest.
			HostCPU *struct {
				IRQPerMB    bench.Summary `json:"guest_irq_per_mb"`
				IRQPerMBRev bench.Summary `json:"guest_irq_per_mb_rev"`
				IRQPerTxn   bench.Summary `json:"guest_irq_per_txn"`
			} `json:"host_cpu"`
		} `json:"rows"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("bench --json is not one JSON document: %v", err)
	}
	if doc.Machine.Kernel == "" || doc.Machine.Cores == 0 {
		t.Fatalf("bench report lacks the machine: %+v", doc)
	}
	got := map[string]bool{}
	for i, r := range doc.Rows {
		got[r.Path] = true
		if r.TCP.Median <= 0 || r.P50 <= 0 || r.P99 < r.P50 || r.CPS <= 0 {
			t.Errorf("row %d = %+v: want positive metrics", i, r)
		}
		if r.Path == "lanekit-vm" || r.Path == "bridge-tap-vm" {
			if h := r.HostCPU; h == nil || h.IRQPerMB.Median <= 0 || h.IRQPerMBRev.Median <= 0 || h.IRQPerTxn.Median <= 0 {
				t.Errorf("%s: the guest NIC's interrupts were not counted in its host CPU runs: %+v", r.Path, h)
			}
		}
	}
	for _, want := range []string{"host-raw", "host", "bridge-iptables", "lanekit-pod", "lanekit-vm", "bridge-tap-vm"} {
		if !got[want] {
			t.Errorf("bench report has no %s row: %+v", want, doc.Rows)
		}
	}
	if f, err := os.Open(chart); err != nil {
		t.Errorf("chart: %v", err)
	} else {
		if _, err := png.Decode(f); err != nil {
			t.Errorf("chart is not a PNG: %v", err)
		}
		f.Close()
	}

	if _, err := lk(t, "lab", "down"); err != nil {
		t.Fatalf("lab down: %v", err)
	}
	assertGone(t)

	// Debris of a half-done up: a node netns, a run dir and a pid file of a
	// long-gone process. Down removes it and stays idempotent.
	if err := exec.Command("ip", "netns", "add", NodeNS(1)).Run(); err != nil {
		t.Fatalf("make debris: %v", err)
	}
	if err := os.MkdirAll(NodeDir(1), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(AgentPIDFile(1), []byte("999999999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := lk(t, "lab", "down"); err != nil {
			t.Fatalf("lab down after debris: %v", err)
		}
		assertGone(t)
	}
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test directory")
		}
		dir = parent
	}
}

// testBins are the lab's binaries: in $LANEKIT_BIN, else the repository's bin/.
func testBins(t *testing.T) Bins {
	t.Helper()
	binDir := os.Getenv("LANEKIT_BIN")
	if binDir == "" {
		binDir = filepath.Join(repoRoot(t), "bin")
	}
	return Bins{Dir: binDir, CNIDir: filepath.Join(binDir, "cni")}
}

// requireLabBins skips t unless it runs as root (which it needs for why) with
// tools installed, and returns testBins; a missing binary skips too, but fails
// under make test (which sets LANEKIT_BIN after building them).
func requireLabBins(t *testing.T, why string, tools ...string) Bins {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: " + why)
	}
	lockLab()
	testutil.RequireTools(t, tools...)
	bins := testBins(t)
	for _, check := range []func() error{bins.checkBaseline, bins.checkLanekit} {
		if err := check(); err != nil {
			if os.Getenv("LANEKIT_BIN") != "" {
				t.Fatalf("%v (make test builds them first)", err)
			}
			testutil.MissingDep(t, "%v", err)
		}
	}
	return bins
}
