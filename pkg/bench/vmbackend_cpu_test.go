package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseSchedstatAndStat(t *testing.T) {
	if d, err := ParseSchedstat("1234567890 5000 42\n"); err != nil || d != 1234567890*time.Nanosecond {
		t.Errorf("schedstat: %v %v", d, err)
	}
	for _, bad := range []string{"", "1 2", "x 2 3"} {
		if _, err := ParseSchedstat(bad); err == nil {
			t.Errorf("schedstat %q: no error", bad)
		}
	}
	// comm with a space and a parenthesis; utime 250, stime 50 ticks.
	stat := "4242 (lcore (worker) 1) R 1 4242 4242 0 -1 4194560 10 0 0 0 250 50 0 0 20 0 3 0 100 0 0"
	if u, st, err := ParseStatTimes(stat, 100); err != nil || u != 2500*time.Millisecond || st != 500*time.Millisecond {
		t.Errorf("stat: %v %v %v, want 2.5s 0.5s", u, st, err)
	}
	if _, _, err := ParseStatTimes("4242 (x) R 1 2", 100); err == nil {
		t.Error("short stat: no error")
	}
	// Our own process has run a little.
	if d, err := processCPU(os.Getpid()); err != nil || d <= 0 {
		t.Errorf("processCPU(self) = %v, %v", d, err)
	}
	if c, err := processTimes(os.Getpid()); err != nil || c.user < 0 || c.sys < 0 {
		t.Errorf("processTimes(self) = %+v, %v", c, err)
	}
}

func TestParseTestpmdCycles(t *testing.T) {
	// DPDK 22.11 testpmd --record-core-cycles, at "stop".
	line := "  CPU cycles/packet=3475.25 (total cycles=2085133024 / total io packets=599995) at 2600 MHz Clock"
	ns, err := ParseTestpmdCycles(line)
	if err != nil || math.Abs(ns-3475.25/2.6) > 1e-6 {
		t.Fatalf("got %v, %v; want %v", ns, err, 3475.25/2.6)
	}
	// Later releases call them busy cycles.
	if ns, err := ParseTestpmdCycles("CPU cycles/packet=100.00 (busy cycles=100 / total io packets=1) at 1000 MHz Clock"); err != nil || ns != 100 {
		t.Errorf("busy form: %v %v", ns, err)
	}
	for _, bad := range []string{"", "Press enter to exit",
		"CPU cycles/packet=1.00 (total cycles=0 / total io packets=0) at 2600 MHz Clock"} {
		if _, err := ParseTestpmdCycles(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestCPURunAndDirection(t *testing.T) {
	r := cpuRun{frames: 250_000, offered: 250_100, cpu: time.Second, window: 5 * time.Second}
	if r.nsPerFrame() != 4000 || r.pps() != 50_000 || r.share() != 0.2 {
		t.Errorf("ns/frame %v pps %v share %v", r.nsPerFrame(), r.pps(), r.share())
	}
	if err := r.check(); err != nil {
		t.Errorf("carried load refused: %v", err)
	}
	short := cpuRun{frames: 200_000, offered: 250_000, cpu: time.Second, window: 5 * time.Second}
	if err := short.check(); err != nil || short.delivered() != 0.8 {
		t.Errorf("80%% delivered: %v, %v", err, short.delivered())
	}
	lost := cpuRun{frames: 100_000, offered: 250_000, cpu: time.Second, window: 5 * time.Second}
	if err := lost.check(); err == nil || !strings.Contains(err.Error(), "40.0%") {
		t.Errorf("40%% delivered: %v", err)
	}
	slow := cpuRun{frames: 200_000, offered: 200_000, cpu: time.Second, window: 5 * time.Second}
	if err := slow.check(); err == nil || !strings.Contains(err.Error(), "offered 40000 frames/s of 50000") {
		t.Errorf("40 kframes/s offered: %v", err)
	}
	if err := (cpuRun{}).check(); err == nil {
		t.Error("empty run accepted")
	}
	if !math.IsNaN((cpuRun{}).nsPerFrame()) {
		t.Error("ns/frame of no frames is not NaN")
	}

	lk := []cpuRun{
		{frames: 100, offered: 100, cpu: 150 * time.Microsecond, window: time.Millisecond, busyNs: 900},  // 1500 ns
		{frames: 100, offered: 100, cpu: 170 * time.Microsecond, window: time.Millisecond, busyNs: 1100}, // 1700
		{frames: 100, offered: 100, cpu: 160 * time.Microsecond, window: time.Millisecond, busyNs: 1000}, // 1600
	}
	tp := []cpuRun{
		{frames: 100, offered: 100, cpu: time.Millisecond, window: time.Millisecond, busyNs: 1900},
		{frames: 100, offered: 100, cpu: time.Millisecond, window: time.Millisecond, busyNs: 2100},
		{frames: 100, offered: 100, cpu: time.Millisecond, window: time.Millisecond, busyNs: 2000},
	}
	d := cpuDirection(lk, tp)
	if d.LanekitVhost.NsPerFrame != (Summary{1500, 1600, 1700}) || d.LanekitVhost.BusyNsPerFrame != (Summary{900, 1000, 1100}) {
		t.Errorf("lanekit side %+v", d.LanekitVhost)
	}
	if d.Testpmd.NsPerFrame.Median != 10_000 || d.Testpmd.BusyNsPerFrame != (Summary{1900, 2000, 2100}) || d.Testpmd.CPUShare.Median != 1 {
		t.Errorf("testpmd side %+v", d.Testpmd)
	}
	// busy / busy, process / process (testpmd's polling core), lanekit process / testpmd busy.
	for name, c := range map[string]struct {
		got  *float64
		want float64
	}{"ratio": {d.Ratio, 0.5}, "process": {d.ProcessRatio, 0.16}, "conservative": {d.ConservativeRatio, 0.8}} {
		if c.got == nil || math.Abs(*c.got-c.want) > 1e-9 {
			t.Errorf("%s ratio %v, want %v", name, c.got, c.want)
		}
	}
	if d := cpuDirection(lk, nil); d.Ratio != nil || d.ProcessRatio != nil || d.ConservativeRatio != nil {
		t.Errorf("ratios without testpmd runs: %+v", d)
	}
	if cpuDirection(nil, nil) != nil {
		t.Error("direction without runs")
	}
}

func TestBackendTargets(t *testing.T) {
	f := func(x float64) *float64 { return &x }
	rep := sampleBackend() // 64 B ratio 1.25, 1500 B unknown
	rep.CPU = &BackendCPU{GuestToWire: &CPUDirection{Ratio: f(0.95)}, WireToGuest: &CPUDirection{Ratio: f(0.5)}}
	ts := backendTargets(rep)
	if len(ts) != 4 {
		t.Fatalf("%d targets", len(ts))
	}
	want := []struct {
		met  bool
		text string
	}{
		{true, "met (1.25×)"},
		{false, "not measured"},
		{false, "missed, 0.95× (lanekit-vhost's CPU per frame needs -5.3%)"},
		{true, "met (0.50×)"},
	}
	for i, w := range want {
		if ts[i].Met != w.met || !strings.Contains(ts[i].String(), w.text) {
			t.Errorf("target %d: %+v %q, want met=%v %q", i, ts[i], ts[i], w.met, w.text)
		}
	}
	short := BackendTarget{Name: "x", Op: ">=", Want: 1.05, Ratio: f(1.0)}
	if s := short.String(); !strings.Contains(s, "missed, 1.00× (lanekit-vhost needs +5.0%)") {
		t.Errorf("%q", s)
	}
	rep.CPU = nil
	if ts := backendTargets(rep); len(ts) != 2 {
		t.Errorf("without cpu runs: %d targets", len(ts))
	}
}

func TestBackendCPUJSONAndTable(t *testing.T) {
	lk := []cpuRun{{frames: 100_000, offered: 100_000, cpu: 150 * time.Millisecond, window: time.Second, busyNs: 1500}}
	tp := []cpuRun{{frames: 100_000, offered: 100_000, cpu: time.Second, window: time.Second, busyNs: 2000}}
	if err := lk[0].check(); err != nil {
		t.Fatal(err)
	}
	rep := sampleBackend()
	rep.CPU = &BackendCPU{OfferedPPS: cpuRate, Size: cpuSize, Setup: "s", GuestToWire: cpuDirection(lk, tp)}
	rep.Targets = backendTargets(rep)
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		CPU struct {
			OfferedPPS  float64                    `json:"offered_pps"`
			GuestToWire map[string]json.RawMessage `json:"guest_to_wire"`
			WireToGuest *json.RawMessage           `json:"wire_to_guest"`
		} `json:"cpu_per_frame"`
		Targets []BackendTarget `json:"targets"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.CPU.OfferedPPS != cpuRate || string(doc.CPU.GuestToWire["ratio"]) != "0.75" || doc.CPU.WireToGuest != nil {
		t.Errorf("cpu_per_frame %s", b)
	}
	if len(doc.Targets) != 4 || !doc.Targets[2].Met || doc.Targets[3].Ratio != nil {
		t.Errorf("targets %+v", doc.Targets)
	}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"VM backend CPU per frame", "guest→wire  lanekit-vhost  100.0 (100.0–100.0)", "1500 (1500–1500)",
		"2000 (2000–2000)", "0.75×       0.15×          0.75×", "targets:", "guest→wire CPU per frame", "wire→guest CPU per frame           ≤ 0.90×: not measured"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, buf.String())
		}
	}
}

func TestWireFrame(t *testing.T) {
	f := wireFrame(benchVMMAC, 64)
	if len(f) != 64 || !bytes.Equal(f[:6], benchVMMAC) || f[12] != 0x08 || f[23] != 17 {
		t.Fatalf("frame % x", f)
	}
	// A valid header sums to zero with its checksum in place.
	if c := ipChecksum(f[14:34]); c != 0 {
		t.Errorf("header checksum residue %#x", c)
	}
	if l := int(f[16])<<8 | int(f[17]); l != 50 {
		t.Errorf("ip total length %d", l)
	}
}

func TestBackendBusy(t *testing.T) {
	text := `# HELP lanekit_vhost_busy_seconds Time in serve rounds that moved frames
# TYPE lanekit_vhost_busy_seconds counter
lanekit_vhost_busy_seconds_total{vm="vm1",queue="0"} 1.5
lanekit_vhost_busy_seconds_total{vm="vm1",queue="1"} 0.25
lanekit_vhost_rx_packets_total{vm="vm1",queue="0"} 7
`
	if v, err := backendBusy(text); err != nil || v != 1.75 {
		t.Errorf("got %v, %v; want 1.75", v, err)
	}
	if _, err := backendBusy("lanekit_vhost_rx_packets_total{vm=\"vm1\",queue=\"0\"} 7\n"); err == nil {
		t.Error("no busy family: no error")
	}
	if _, err := backendBusy("lanekit_vhost_busy_seconds_total{vm=\"vm1\"} x\n"); err == nil {
		t.Error("bad value: no error")
	}
}

func TestTimeSplitAndWhere(t *testing.T) {
	v := splitValues{}
	// lanekit-vhost: a whole core, 5% user; testpmd: 8% user.
	v.add(kindOwn, 64, cpuSplit{user: 50 * time.Millisecond, sys: 950 * time.Millisecond, window: time.Second})
	v.add(kindOwn, 64, cpuSplit{user: 40 * time.Millisecond, sys: 960 * time.Millisecond, window: time.Second})
	v.add(kindOwn, 64, cpuSplit{user: 60 * time.Millisecond, sys: 940 * time.Millisecond, window: time.Second})
	v.add(kindTestpmd, 64, cpuSplit{user: 80 * time.Millisecond, sys: 920 * time.Millisecond, window: time.Second})
	sum := v.summary()
	if len(sum) != 2 || sum[0].Kind != kindOwn || math.Abs(sum[0].UserShare.Median-0.05) > 1e-9 ||
		math.Abs(sum[0].UserShare.Min-0.04) > 1e-9 || sum[0].CPUShare.Median != 1 || math.Abs(sum[1].UserShare.Median-0.08) > 1e-9 {
		t.Fatalf("summary %+v", sum)
	}
	f := func(x float64) *float64 { return &x }
	rep := &BackendReport{PPS64: BackendMetric{Ratio: f(1.01)}, TimeSplit: sum}
	ts := backendTargets(rep)
	s := ts[0].String()
	for _, want := range []string{"missed, 1.01× (lanekit-vhost needs +4.0%)", "lanekit-vhost 100% of a core, 5.0% of it in its own code, 95.0% in the kernel",
		"testpmd 100%, 8.0% own code", "at most +5.3%"} {
		if !strings.Contains(s, want) {
			t.Errorf("target lacks %q: %s", want, s)
		}
	}
	if ts[1].Where != "" {
		t.Errorf("1500 B where without 1500 B splits: %q", ts[1].Where)
	}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "guest→wire   64 B lanekit_vhost        backend 100% of a core, 5.0% of it user space (4.0–6.0), the rest kernel") {
		t.Errorf("table:\n%s", buf.String())
	}
}

func TestParseLoadAvg(t *testing.T) {
	if v := parseLoadAvg("7.56 6.80 5.05 3/412 24203\n"); v != 7.56 {
		t.Errorf("got %v", v)
	}
	if v := parseLoadAvg(""); v != 0 {
		t.Errorf("empty: %v", v)
	}
	var buf bytes.Buffer
	rep := sampleBackend()
	rep.LoadAvg = [2]float64{0.4, 1.2}
	if err := rep.WriteTable(&buf); err != nil || !strings.Contains(buf.String(), "load average 0.4 → 1.2") {
		t.Errorf("table (%v):\n%s", err, buf.String())
	}
}

func TestTargetsContended(t *testing.T) {
	f := func(x float64) *float64 { return &x }
	rep := &BackendReport{PPS64: BackendMetric{Ratio: f(1.2)}, Gbps1500: BackendMetric{Ratio: f(1.06)},
		TimeSplit: []BackendTimeSplit{
			{Kind: kindOwn, Size: 64, CPUShare: Summary{Median: 0.63}}, {Kind: kindTestpmd, Size: 64, CPUShare: Summary{Median: 0.66}},
			{Kind: kindOwn, Size: 1500, CPUShare: Summary{Median: 0.99}}, {Kind: kindTestpmd, Size: 1500, CPUShare: Summary{Median: 1}},
			{Kind: kindRealTX, Size: 1500, CPUShare: Summary{Median: 0.5}}, // not a ratio's row
		},
		CPU: &BackendCPU{
			GuestToWire: &CPUDirection{Ratio: f(0.8), Testpmd: CPUSide{CPUShare: Summary{Median: 0.57}}},
			WireToGuest: &CPUDirection{Ratio: f(0.8), Testpmd: CPUSide{CPUShare: Summary{Median: 0.99}}},
		}}
	ts := backendTargets(rep)
	if !ts[0].Contended || ts[0].Why != "lanekit_vhost got 63% of its core, testpmd got 66% of its core" ||
		!strings.Contains(ts[0].String(), "met (1.20×) [CONTENDED, not a verdict: lanekit_vhost got 63%") {
		t.Errorf("64 B: %+v %q", ts[0], ts[0])
	}
	if ts[1].Contended || strings.Contains(ts[1].String(), "CONTENDED") {
		t.Errorf("1500 B: %+v", ts[1])
	}
	if !ts[2].Contended || !strings.Contains(ts[2].Why, "testpmd got 57% of its core") || ts[3].Contended {
		t.Errorf("cpu: %+v %+v", ts[2], ts[3])
	}
}
