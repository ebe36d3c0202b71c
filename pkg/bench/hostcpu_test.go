package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestParseProcStatIdle(t *testing.T) {
	stat := []byte("cpu  100 5 50 9000 40 3 7 11 0 0\ncpu0 50 2 25 4500 20 1 3 5 0 0\n")
	got, err := ParseProcStatIdle(stat)
	if err != nil {
		t.Fatal(err)
	}
	// idle + iowait + steal
	if want := 9051 * 10 * time.Millisecond; got != want {
		t.Errorf("idle %v, want %v", got, want)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5 6 7 8\n", "cpu 1 2 3 x 5 6 7 8\n", "cpu 1 2\n"} {
		if _, err := ParseProcStatIdle([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestHostCPU(t *testing.T) {
	t0 := time.Unix(1000, 0)
	before := cpuTimes{idle: 10 * time.Second, vcpu: 3 * time.Second, at: t0}
	// 2 CPUs for 4 s = 8 s; 3 s idle -> 5 s busy; the vCPUs ran 2 s of it
	after := cpuTimes{idle: 13 * time.Second, vcpu: 5 * time.Second, at: t0.Add(4 * time.Second)}
	if got := hostCPU(before, after, 2); got != 3*time.Second {
		t.Errorf("host CPU %v, want 3s", got)
	}
	after.vcpu = 20 * time.Second
	if got := hostCPU(before, after, 2); got != 0 {
		t.Errorf("host CPU %v, want 0 (clamped)", got)
	}
}

func TestIsVCPUThread(t *testing.T) {
	for comm, want := range map[string]bool{
		"CPU 0/TCG\n": true, "CPU 11/KVM": true, "qemu-system-x86": false, "IO mon_iothread": false,
		"worker": false, "CPU 0/": false,
	} {
		if got := IsVCPUThread(comm); got != want {
			t.Errorf("%q: %v, want %v", comm, got, want)
		}
	}
}

func TestParseIperf3Bytes(t *testing.T) {
	n, err := ParseIperf3Bytes([]byte(`{"end":{"sum_received":{"bytes":125000000,"bits_per_second":2e8}}}`))
	if err != nil || n != 125000000 {
		t.Fatalf("%d, %v", n, err)
	}
	for _, bad := range []string{`{"error":"unable to connect"}`, `{"end":{}}`, `not json`} {
		if _, err := ParseIperf3Bytes([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// The VM targets compare lanekit-vm with bridge-tap-vm per repetition, and
// the host CPU lines print for the guest rows.
func TestVMTargetsAndHostCPU(t *testing.T) {
	f := func(xs ...float64) []*float64 {
		out := make([]*float64, len(xs))
		for i := range xs {
			out[i] = &xs[i]
		}
		return out
	}
	hc := &HostCPU{TCPMbps: 200, MachineWideNote: hostCPUNote,
		NsPerByte: Summary{Median: 5}, NsPerByteRev: Summary{Median: 6}, UsPerTxn: Summary{Median: 40},
		Parts: []HostCPUPart{{Name: "lanekit-vhost", NsPerByte: Summary{Median: 1.5}}}}
	r := &Report{Rows: []Row{
		{Path: VMPath, HostCPU: hc, Reps: Reps{TCPGbps: f(1.4, 1.5), TCPRevGbps: f(1.0, 1.0), RRP50us: f(80, 90),
			CPS: f(100, 100), CPUNsPerByte: f(3, 3), CPUNsPerByteRev: f(8, 8), CPUUsPerTxn: f(20, 30)}},
		{Path: TapVMPath, HostCPU: hc, Reps: Reps{TCPGbps: f(1, 1), TCPRevGbps: f(1, 1), RRP50us: f(100, 100),
			CPS: f(100, 100), CPUNsPerByte: f(5, 5), CPUNsPerByteRev: f(10, 10), CPUUsPerTxn: f(40, 40)}},
	}}
	got := map[string]bool{}
	for _, tr := range checkTargets(r) {
		if tr.Path == VMPath {
			got[tr.Metric] = tr.Met
		}
	}
	want := map[string]bool{"tcp_gbps": true, "tcp_rev_gbps": false, "rr_p50_us": true, "cps": true,
		"cpu_ns_per_byte": true, "cpu_ns_per_byte_rev": false}
	for m, met := range want {
		if v, ok := got[m]; !ok || v != met {
			t.Errorf("target %s: met %v (present %v), want %v", m, v, ok, met)
		}
	}
	var b bytes.Buffer
	r.writeHostCPU(&b)
	for _, s := range []string{"host CPU (lanekit-vm): 5.00", "at 200 Mbit/s", "(RR, one in flight)",
		"host CPU per transaction lanekit-vm / bridge-tap-vm: 0.62 ×", "quiet machine",
		"of which lanekit-vhost: 1.50"} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("host CPU lines lack %q:\n%s", s, b.String())
		}
	}
}
