package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBackendFillRows: each row compares the right lanekit-vhost kind with
// the right testpmd kind; the guest→wire agent row shares testpmd's
// guest→wire values, wire→guest has its own.
func TestBackendFillRows(t *testing.T) {
	vals := backendValues{}
	for kind, v := range map[string][2]float64{
		kindOwn: {1.0e6, 10}, kindTestpmd: {2.0e6, 20}, kindRealTX: {1.5e6, 15},
		kindRealRX: {0.9e6, 9}, kindTestpmdRX: {0.6e6, 12},
	} {
		vals.add(kind, 64, v[0])
		vals.add(kind, frameSize1500, v[1])
	}
	var r BackendReport
	r.fill(vals, true)
	ratio := func(m BackendMetric) float64 {
		if m.Ratio == nil {
			return math.NaN()
		}
		return *m.Ratio
	}
	for name, c := range map[string]struct {
		m        BackendMetric
		lk, tp   float64
		wantRate float64
	}{
		"own 64":        {r.PPS64, 1.0e6, 2.0e6, 0.5},
		"own 1500":      {r.Gbps1500, 10, 20, 0.5},
		"agent tx 64":   {r.GuestToWireReal.PPS64, 1.5e6, 2.0e6, 0.75},
		"agent tx 1500": {r.GuestToWireReal.Gbps1500, 15, 20, 0.75},
		"agent rx 64":   {r.WireToGuestReal.PPS64, 0.9e6, 0.6e6, 1.5},
		"agent rx 1500": {r.WireToGuestReal.Gbps1500, 9, 12, 0.75},
	} {
		if c.m.LanekitVhost.Median != c.lk || c.m.Testpmd.Median != c.tp || math.Abs(ratio(c.m)-c.wantRate) > 1e-9 {
			t.Errorf("%s: %+v ratio %v, want %v / %v = %v", name, c.m, ratio(c.m), c.lk, c.tp, c.wantRate)
		}
	}
	// Without the agent path, no real-path rows (and no JSON fields).
	var own BackendReport
	own.fill(vals, false)
	if own.GuestToWireReal != nil || own.WireToGuestReal != nil || own.PPS64.LanekitVhost.Median != 1.0e6 {
		t.Errorf("own-only report %+v", own)
	}
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(&own); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "real") || strings.Contains(buf.String(), "path_check") {
		t.Errorf("own-only json has agent fields: %s", buf.String())
	}
}

func sampleAgentBackend() *BackendReport {
	b := sampleBackend()
	r := 0.8
	b.GuestToWireReal = &BackendDirection{
		PPS64:    BackendMetric{LanekitVhost: Summary{1.1e6, 1.2e6, 1.3e6}, Testpmd: Summary{0.9e6, 1.0e6, 1.1e6}},
		Gbps1500: BackendMetric{LanekitVhost: Summary{11, 11.5, 12}, Testpmd: Summary{9, 10, 11}}}
	b.WireToGuestReal = &BackendDirection{
		PPS64:    BackendMetric{LanekitVhost: Summary{0.7e6, 0.8e6, 0.9e6}, Testpmd: Summary{0.9e6, 1.0e6, 1.1e6}, Ratio: &r},
		Gbps1500: BackendMetric{LanekitVhost: Summary{7, 8, 9}, Testpmd: Summary{6, 6.5, 7}}}
	b.PathCheck = &BackendPathCheck{VMDevice: bfVMDev, XDPProgram: "steer_vm", Handovers: 12, ProbeSent: 16, ProbeCounted: 16,
		BackendRxFrames: 4242, SteerDrops: map[string]uint64{"not-for-vm": 16}}
	return b
}

func TestBackendAgentJSONAndTable(t *testing.T) {
	rep := &Report{Repeat: 3, DurationS: 5, VMBackend: sampleAgentBackend()}
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		VMBackend struct {
			PPS64     map[string]json.RawMessage            `json:"pps_64"`
			TX        map[string]map[string]json.RawMessage `json:"guest_to_wire_real"`
			RX        map[string]map[string]json.RawMessage `json:"wire_to_guest_real"`
			PathCheck map[string]json.RawMessage            `json:"path_check"`
		} `json:"vm_backend"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if _, ok := doc.VMBackend.PPS64["lanekit_vhost"]; !ok {
		t.Errorf("existing pps_64 lost: %s", buf.String())
	}
	for dir, d := range map[string]map[string]map[string]json.RawMessage{"guest_to_wire_real": doc.VMBackend.TX, "wire_to_guest_real": doc.VMBackend.RX} {
		for _, metric := range []string{"pps_64", "gbps_1500"} {
			for _, k := range []string{"lanekit_vhost", "testpmd", "ratio"} {
				if _, ok := d[metric][k]; !ok {
					t.Errorf("vm_backend.%s.%s.%s missing in %s", dir, metric, k, buf.String())
				}
			}
		}
	}
	if string(doc.VMBackend.RX["pps_64"]["ratio"]) != "0.8" {
		t.Errorf("wire_to_guest_real.pps_64.ratio = %s", doc.VMBackend.RX["pps_64"]["ratio"])
	}
	for k, want := range map[string]string{"xdp_program": `"steer_vm"`, "handovers": "12", "not_for_vm_probe_sent": "16",
		"not_for_vm_probe_counted": "16", "backend_rx_frames": "4242", "vm_device": `"lkv0"`} {
		if got := string(doc.VMBackend.PathCheck[k]); got != want {
			t.Errorf("path_check.%s = %s, want %s", k, got, want)
		}
	}

	buf.Reset()
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	text := buf.String()
	lines := strings.Split(text, "\n")
	find := func(parts ...string) string {
		for _, l := range lines {
			all := true
			for _, p := range parts {
				all = all && strings.Contains(l, p)
			}
			if all {
				return l
			}
		}
		return ""
	}
	for _, row := range [][]string{
		{"guest→wire", "own (--ifname)", "64 B Mpps", "1.250 (1.000–1.300)", "1.25×"},
		{"guest→wire", "agent (steer_vm)", "64 B Mpps", "1.200 (1.100–1.300)", "1.000 (0.900–1.100)", "-"},
		{"guest→wire", "agent (steer_vm)", "1500 B Gbit/s", "11.50 (11.00–12.00)"},
		{"wire→guest", "agent (steer_vm)", "64 B Mpps", "0.800 (0.700–0.900)", "0.80×"},
		{"wire→guest", "agent (steer_vm)", "1500 B Gbit/s", "8.00 (7.00–9.00)", "6.50 (6.00–7.00)"},
		{`XDP program "steer_vm" on lkv0`, "12 socket handover(s)", "16/16 not-for-vm probes", "4242 frames", "not-for-vm=16"},
	} {
		if find(row...) == "" {
			t.Errorf("no line with %q in:\n%s", row, text)
		}
	}
}

func TestParseTestpmdRxPackets(t *testing.T) {
	for line, want := range map[string]uint64{
		"  RX-packets: 1543210    RX-missed: 0          RX-bytes:  98765440": 1543210,
		"\x1b[2J\x1b[1;1H  RX-packets: 7 RX-missed: 0":                       7,
	} {
		if n, ok := ParseTestpmdRxPackets(line); !ok || n != want {
			t.Errorf("%q: %d %v, want %d", line, n, ok, want)
		}
	}
	for _, bad := range []string{"  TX-packets: 5", "  RX-packets:", "  RX-packets: x", "Rx-pps: 12"} {
		if n, ok := ParseTestpmdRxPackets(bad); ok {
			t.Errorf("%q parsed as %d", bad, n)
		}
	}
}

func TestBackendPacketsParse(t *testing.T) {
	text := "# HELP lanekit_vhost_rx_packets Frames delivered to the guest\n" +
		"# TYPE lanekit_vhost_rx_packets counter\n" +
		`lanekit_vhost_rx_packets_total{vm="vmbench",queue="0"} 1000` + "\n" +
		`lanekit_vhost_rx_packets_total{vm="vmbench",queue="1"} 234` + "\n" +
		`lanekit_vhost_tx_packets_total{vm="vmbench",queue="0"} 99` + "\n" +
		`lanekit_vhost_rx_bytes_total{vm="vmbench",queue="0"} 64000` + "\n" + "# EOF\n"
	if rx, tx, err := backendPackets(text); err != nil || rx != 1234 || tx != 99 {
		t.Errorf("got %d, %d, %v; want 1234, 99", rx, tx, err)
	}
	if _, _, err := backendPackets(`lanekit_vhost_up{vm="x"} 1`); err == nil {
		t.Error("no packet counters: no error")
	}
	if b, n, err := sumCounter(text, "lanekit_vhost_rx_bytes_total"); err != nil || b != 64000 || n != 1 {
		t.Errorf("rx bytes: got %v (%d samples), %v; want 64000 (1)", b, n, err)
	}
	if _, _, err := backendPackets(`lanekit_vhost_rx_packets_total{vm="x"} abc`); err == nil {
		t.Error("bad value: no error")
	}
}

func TestProbeFrame(t *testing.T) {
	f := probeFrame(benchVMMAC, []byte{2, 0, 0, 0, 0, 2})
	if len(f) != 60 || !bytes.Equal(f[:6], benchVMMAC) || f[6] != 2 || f[11] != 2 || f[12] != 8 || f[13] != 0 {
		t.Errorf("frame % x", f)
	}
}

// A backend that exits at once: its error line is in the message every
// time (the process can exit before the reader has logged its output; the
// busy retry of startBackend reads the same lines).
func TestWaitSocketReportsExitOutput(t *testing.T) {
	for i := range 20 {
		p, err := startProc(context.Background(), 10*time.Second, "backend", "sh", "-c", "echo 'bind: device or resource busy' >&2; exit 1")
		if err != nil {
			t.Fatal(err)
		}
		err = waitSocket(filepath.Join(t.TempDir(), "none.sock"), 5*time.Second, p)
		if err == nil || !strings.Contains(err.Error(), "resource busy") {
			t.Fatalf("run %d: %v, want the backend's output in the error", i, err)
		}
	}
}
