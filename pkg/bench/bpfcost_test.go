package bench

import (
	"bytes"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/lanekit/lanekit/internal/testutil"
)

func TestCostPerConn(t *testing.T) {
	before := bpfSnapshot{
		1: {name: "from_pod", runs: 100, ns: 100_000},
		2: {name: "from_pod", runs: 50, ns: 60_000},
		3: {name: "to_uplink", runs: 10, ns: 1_000},
		4: {name: "idle", runs: 7, ns: 700},
		5: {name: "replaced", runs: 1_000, ns: 1_000_000},
	}
	after := bpfSnapshot{
		1: {name: "from_pod", runs: 500, ns: 500_000},     // +400 runs, +400 µs
		2: {name: "from_pod", runs: 450, ns: 460_000},     // +400 runs, +400 µs
		3: {name: "to_uplink", runs: 410, ns: 41_000},     // +400 runs, +40 µs
		4: {name: "idle", runs: 7, ns: 700},               // did not run
		5: {name: "new-under-old-id", runs: 3, ns: 3_000}, // an ID reused by a new program: not counted
		6: {name: "loaded-meanwhile", runs: 100, ns: 100_000},
	}
	c, ok := costPerConn(before, after, 100)
	if !ok {
		t.Fatal("costPerConn: not ok with 100 connections")
	}
	// (400+400+40+100) µs over 100 connections
	if want := 9_400.0; c.nsPerConn != want {
		t.Errorf("ns per connection %v, want %v", c.nsPerConn, want)
	}
	if got := c.byName["from_pod"]; got != 8_000 {
		t.Errorf("from_pod (two programs summed) %v ns/conn, want 8000", got)
	}
	if got := c.runs["from_pod"]; got != 8 {
		t.Errorf("from_pod %v runs/conn, want 8", got)
	}
	for _, name := range []string{"idle", "new-under-old-id"} {
		if _, ok := c.byName[name]; ok {
			t.Errorf("%s counted", name)
		}
	}
	if got := topPrograms(c.byName, 2); strings.Join(got, ",") != "from_pod,loaded-meanwhile" {
		t.Errorf("top programs %v", got)
	}
	if _, ok := costPerConn(before, after, 0); ok {
		t.Error("costPerConn with no connection: ok")
	}
}

func TestBPFCostReport(t *testing.T) {
	s := newSamples(3)
	for rep, c := range []bpfCost{
		{nsPerConn: 10_000, byName: map[string]float64{"a": 6_000, "b": 4_000}, runs: map[string]float64{"a": 4, "b": 4}},
		{nsPerConn: 12_000, byName: map[string]float64{"a": 12_000}, runs: map[string]float64{"a": 4}},
	} {
		s.bpfConn.record(rep, c)
	}
	// repetition 3 failed: not measured
	total, progs := bpfCostOf(&s.bpfConn)
	if total == nil || total.Median != 11_000 || total.Min != 10_000 || total.Max != 12_000 {
		t.Fatalf("total %+v, want 10000/11000/12000", total)
	}
	// b did not run in repetition 2: 0 there, median of (4000, 0)
	want := []BPFProgramCost{{Name: "a", NsPerConn: 9_000, RunsPerConn: 4}, {Name: "b", NsPerConn: 2_000, RunsPerConn: 2}}
	if len(progs) != len(want) {
		t.Fatalf("programs %+v, want %+v", progs, want)
	}
	for i := range want {
		if progs[i] != want[i] {
			t.Errorf("program %d: %+v, want %+v", i, progs[i], want[i])
		}
	}
	raw := &Summary{Median: 10}
	rr := &Summary{Min: 1_000, Median: 2_000, Max: 3_000}
	r := &Report{Rows: []Row{{Path: "lanekit-pod", BPFNsPerConn: total, BPFPrograms: progs}, {Path: "host", BPFNsPerRR: rr, BPFProgramsRR: []BPFProgramCost{{Name: "from_uplink", NsPerConn: 2_000, RunsPerConn: 2}}},
		{Path: "host-raw", BPFNsPerConn: raw, BPFPrograms: []BPFProgramCost{{Name: "arp", NsPerConn: 10, RunsPerConn: 0.01}}}}}
	var buf bytes.Buffer
	r.writeBPFCost(&buf)
	if out := buf.String(); !strings.Contains(out, "lanekit-pod") || !strings.Contains(out, "11.0 µs (10.0–12.0): a 9.0 µs (4.0 runs), b 2.0 µs (2.0 runs)") || strings.Contains(strings.Split(out, "per round trip")[0], "host ") ||
		!strings.Contains(out, "no program on the path") || strings.Contains(out, "arp") ||
		!strings.Contains(out, "per round trip during RR") || !strings.Contains(out, "2.0 µs (1.0–3.0): from_uplink 2.0 µs (2.0 runs)") {
		t.Errorf("table:\n%s", out)
	}
	empty := newSamples(2)
	if total, progs := bpfCostOf(&empty.bpfConn); total != nil || progs != nil {
		t.Errorf("nothing measured: %+v %+v", total, progs)
	}
}

// TestSnapshotCountsRuns: with the statistics enabled by enableBPFStats,
// a program's runs between two snapshots are seen (BPF_PROG_TEST_RUN).
// Root.
func TestSnapshotCountsRuns(t *testing.T) {
	testutil.RequireRoot(t)
	if b, err := os.ReadFile("/proc/sys/kernel/bpf_stats_enabled"); err == nil && strings.TrimSpace(string(b)) != "0" {
		t.Log("kernel.bpf_stats_enabled is already 1 here: this run cannot tell whether enableBPFStats turns the statistics on")
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "lk_cost_test", Type: ebpf.SocketFilter, License: "GPL",
		Instructions: asm.Instructions{asm.LoadImm(asm.R0, 0, asm.DWord), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	info, err := prog.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	stats := enableBPFStats()
	if stats == nil {
		t.Fatal("enableBPFStats: nil as root")
	}
	defer stats.Close()
	before, err := snapshotBPF()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := before[id]; !ok {
		t.Fatalf("program %d not in the snapshot", id)
	}
	const runs = 1000
	if _, _, err := prog.Benchmark(make([]byte, 64), runs, nil); err != nil {
		t.Fatal(err)
	}
	after, err := snapshotBPF()
	if err != nil {
		t.Fatal(err)
	}
	c, ok := costPerConn(before, after, runs)
	if !ok {
		t.Fatal("not ok")
	}
	if got := c.runs["lk_cost_test"]; got != 1 {
		t.Errorf("runs per 'connection' %v, want 1 (%d runs seen)", got, after[id].runs-before[id].runs)
	}
	if ns := c.byName["lk_cost_test"]; ns <= 0 || math.IsNaN(ns) {
		t.Errorf("run time per run %v ns, want > 0", ns)
	}
}
