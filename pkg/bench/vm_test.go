package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseIPLinkRxPackets(t *testing.T) {
	// Trimmed `ip -n NS -s -j link show dev lkb1` (iproute2 6.1).
	out := `[{"ifindex":2,"ifname":"lkb1","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"],"mtu":1500,` +
		`"stats64":{"rx":{"bytes":98765432,"packets":1543210,"errors":0,"dropped":3},"tx":{"bytes":0,"packets":7}}}]`
	n, err := ParseIPLinkRxPackets([]byte(out))
	if err != nil || n != 1543210 {
		t.Fatalf("got %d, %v; want 1543210", n, err)
	}
	for _, bad := range []string{`[]`, `[{"ifname":"lkb1"}]`, `[{"stats64":{"rx":{}}}]`, `not json`} {
		if _, err := ParseIPLinkRxPackets([]byte(bad)); err == nil || !strings.HasPrefix(err.Error(), "parse ip link json") {
			t.Errorf("%s: error %v", bad, err)
		}
	}
}

func TestBackendMetricAndGbps(t *testing.T) {
	m := backendMetric([]float64{1.2e6, 1.0e6, 1.1e6}, []float64{1.0e6, 0.9e6, 1.1e6})
	if m.LanekitVhost != (Summary{1.0e6, 1.1e6, 1.2e6}) || m.Testpmd != (Summary{0.9e6, 1.0e6, 1.1e6}) {
		t.Fatalf("summaries %+v", m)
	}
	if m.Ratio == nil || math.Abs(*m.Ratio-1.1) > 1e-9 {
		t.Fatalf("ratio %v, want 1.1", m.Ratio)
	}
	if m := backendMetric([]float64{1}, nil); m.Ratio != nil {
		t.Errorf("ratio without testpmd values: %v, want nil", *m.Ratio)
	}
	// 1e6 frames/s of 1500 bytes = 12 Gbit/s.
	if g := ppsToGbps(1e6, 1500); math.Abs(g-12) > 1e-9 {
		t.Errorf("ppsToGbps = %v", g)
	}
}

func sampleBackend() *BackendReport {
	r := 1.25
	return &BackendReport{Repeat: 3, Seconds: 5, Setup: backendSetup,
		PPS64:    BackendMetric{LanekitVhost: Summary{1.0e6, 1.25e6, 1.3e6}, Testpmd: Summary{0.9e6, 1.0e6, 1.1e6}, Ratio: &r},
		Gbps1500: BackendMetric{LanekitVhost: Summary{10, 12, 13}, Testpmd: Summary{9, 10, 11}}}
}

func TestReportVMJSONAndTable(t *testing.T) {
	rep := &Report{Repeat: 3, DurationS: 5, Rows: []Row{
		{Path: HostPath, Server: "netns", TCPGbps: Summary{10, 10, 10}},
		{Path: "lanekit-vm", Server: "guest:vm1", Note: "guest under TCG", TCPGbps: Summary{0.8, 0.9, 1}},
	}, VMBackend: sampleBackend()}
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Rows []struct {
			Path, Server, Note string
		} `json:"rows"`
		VMBackend struct {
			PPS64    map[string]json.RawMessage `json:"pps_64"`
			Gbps1500 map[string]json.RawMessage `json:"gbps_1500"`
		} `json:"vm_backend"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Rows[1].Server != "guest:vm1" || doc.Rows[1].Note != "guest under TCG" || doc.Rows[0].Server != "netns" {
		t.Errorf("rows %+v", doc.Rows)
	}
	for metric, m := range map[string]map[string]json.RawMessage{"pps_64": doc.VMBackend.PPS64, "gbps_1500": doc.VMBackend.Gbps1500} {
		for _, k := range []string{"lanekit_vhost", "testpmd", "ratio"} {
			if _, ok := m[k]; !ok {
				t.Errorf("vm_backend.%s.%s missing in %s", metric, k, buf.String())
			}
		}
	}
	var lk Summary
	if err := json.Unmarshal(doc.VMBackend.PPS64["lanekit_vhost"], &lk); err != nil || lk.Median != 1.25e6 {
		t.Errorf("pps_64.lanekit_vhost = %+v, %v", lk, err)
	}
	if string(doc.VMBackend.PPS64["ratio"]) != "1.25" || string(doc.VMBackend.Gbps1500["ratio"]) != "null" {
		t.Errorf("ratios %s %s", doc.VMBackend.PPS64["ratio"], doc.VMBackend.Gbps1500["ratio"])
	}

	buf.Reset()
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	text := buf.String()
	for _, want := range []string{"lanekit-vm *", "* lanekit-vm: guest under TCG", "VM backend (3 × 5s",
		"64 B Mpps", "1.250 (1.000–1.300)", "1.25×", "1500 B Gbit/s", "12.00 (10.00–13.00)"} {
		if !strings.Contains(text, want) {
			t.Errorf("table lacks %q:\n%s", want, text)
		}
	}
	// Only the backend table when the lab had no rows.
	buf.Reset()
	if err := (&Report{Repeat: 1, DurationS: 1, VMBackend: sampleBackend()}).WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "TCP Gbit/s") || !strings.Contains(buf.String(), "64 B Mpps") {
		t.Errorf("backend-only table:\n%s", buf.String())
	}
	if !(&Report{VMBackend: &BackendReport{Errors: []string{"x"}}}).Failed() {
		t.Error("backend errors do not fail the report")
	}
}

func TestGuestStartCommand(t *testing.T) {
	got := guestStartCommand(25*time.Second, "/tmp/l.log", "lk-bench", "cps-server", "--listen", "10.0.0.1:12865", "it's")
	want := `cd /tmp && timeout 25 lk-bench cps-server --listen 10.0.0.1:12865 'it'\''s' >/tmp/l.log 2>&1 </dev/null & echo LKPID=$!`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if pid, err := parseGuestPID("\nLKPID=123\n"); err != nil || pid != 123 {
		t.Errorf("parseGuestPID: %d %v", pid, err)
	}
	for _, bad := range []string{"", "LKPID=", "LKPID=x", "LKPID=1", "sh: oops"} {
		if _, err := parseGuestPID(bad); err == nil {
			t.Errorf("parseGuestPID(%q): no error", bad)
		}
	}
}

// fakeShell plays a guest: a started server listens after a few polls, and
// "kill" ends it.
type fakeShell struct {
	mu       sync.Mutex
	cmds     []string
	polls    int
	listenAt int  // poll number from which the port listens
	dies     bool // the server exits before listening
	port     int  // the port it listens on (0: iperf3's)
	killed   bool
}

const procTCPHeader = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"

func (f *fakeShell) Run(_ context.Context, cmd string) (string, int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cmds = append(f.cmds, cmd)
	switch {
	case strings.Contains(cmd, "echo LKPID"):
		return "LKPID=4242\n", 0, nil
	case strings.HasPrefix(cmd, "kill -0 4242"):
		f.polls++
		if f.dies {
			return "", 1, nil
		}
		out := procTCPHeader + procTCPHeader
		if f.polls >= f.listenAt {
			// 0A = LISTEN on 0.0.0.0:port (5201 = 0x1451 by default), in
			// the tcp6 table.
			port := f.port
			if port == 0 {
				port = iperfPort
			}
			out += fmt.Sprintf("   0: 00000000000000000000000000000000:%04X 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1\n", port)
		}
		return out, 0, nil
	case strings.HasPrefix(cmd, "kill -9 4242"):
		f.killed = true
		return "", 0, nil
	case strings.HasPrefix(cmd, "cat /tmp/lkbench-"):
		return "iperf3: error - unable to start listener\n", 0, nil
	}
	return "", 127, fmt.Errorf("unexpected command %q", cmd)
}

func TestStartGuestServer(t *testing.T) {
	ctx := context.Background()
	f := &fakeShell{listenAt: 3}
	g := &Guest{Name: "vm1", Shell: f}
	s, err := startGuestServer(ctx, g, 10*time.Second, iperfPort, "iperf3", "-s", "-1")
	if err != nil {
		t.Fatal(err)
	}
	if f.polls != 3 || !strings.HasPrefix(f.cmds[0], "cd /tmp && timeout 10 iperf3 -s -1 >/tmp/lkbench-5201.log") {
		t.Errorf("polls %d, cmds %q", f.polls, f.cmds)
	}
	s.stop()
	if !f.killed {
		t.Error("stop did not kill the guest process")
	}

	f = &fakeShell{dies: true}
	_, err = startGuestServer(ctx, &Guest{Name: "vm1", Shell: f}, 10*time.Second, iperfPort, "iperf3", "-s")
	if err == nil || !strings.Contains(err.Error(), "exited early: iperf3: error - unable to start listener") {
		t.Errorf("dead server: %v", err)
	}

	// A row with a guest starts its servers there, with the guest's tool name.
	f = &fakeShell{listenAt: 1}
	p := Path{Name: "lanekit-vm", ServerIP: "10.244.2.2", Guest: &Guest{Name: "vm1", Shell: f}}
	st, err := p.server(ctx, time.Second, iperfPort, []string{"/bin/lanekit", "lab", "cps-server"}, []string{"lk-bench", "cps-server"})
	if err != nil {
		t.Fatal(err)
	}
	st.stop()
	if !strings.Contains(f.cmds[0], "timeout 1 lk-bench cps-server >") {
		t.Errorf("guest command %q", f.cmds[0])
	}
}

// TestListenIP: a guest behind NAT (KubeVirt's masquerade) is reached at the
// pod's address and listens on its own: the servers bind ListenIP, the
// clients dial ServerIP; without ListenIP both are ServerIP.
func TestListenIP(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct{ listen, wantBind string }{{"10.0.2.2", "10.0.2.2"}, {"", "10.244.0.7"}} {
		f := &fakeShell{listenAt: 1}
		p := Path{Name: "kubevirt-masquerade-vm", ServerIP: "10.244.0.7", ListenIP: c.listen, Guest: &Guest{Name: "vm", Shell: f}}
		srv, client, err := startIperf(ctx, Options{Duration: time.Second}, p, false)
		if err != nil {
			t.Fatal(err)
		}
		srv.stop()
		if !strings.Contains(f.cmds[0], "iperf3 -s -1 -B "+c.wantBind+" ") || !slices.Contains(client, "10.244.0.7") {
			t.Errorf("ListenIP %q: server %q, client %q", c.listen, f.cmds[0], client)
		}
		f.cmds, f.polls, f.port = nil, 0, sockperfPort
		srv, client, err = startSockperf(ctx, Options{Duration: time.Second}, p)
		if err != nil {
			t.Fatal(err)
		}
		srv.stop()
		if !strings.Contains(f.cmds[0], "sockperf sr --tcp -i "+c.wantBind+" ") || !slices.Contains(client, "10.244.0.7") {
			t.Errorf("ListenIP %q: server %q, client %q", c.listen, f.cmds[0], client)
		}
	}
}
