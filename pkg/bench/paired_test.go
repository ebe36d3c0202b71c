package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net"
	"strings"
	"testing"
	"time"
)

// pairedReport: host-raw and lanekit-pod where the machine slows down in
// repetition 2 for both (paired ratios stay put, ratios of medians would
// not), one failed lanekit TCP measurement and CPS errors.
func pairedReport() *Report {
	nan := math.NaN()
	paths := []Path{
		{Name: RawPath, ClientNS: "lk-n1-r1", ServerNS: "lk-n2-r1", ServerIP: "10.77.0.102",
			Includes: Includes{Detail: "node to node, no rules"}},
		{Name: "bridge-iptables", ClientNS: "lk-n1-b1", ServerNS: "lk-n2-b1", ServerIP: "10.245.2.2",
			Includes: Includes{Netfilter: true, Conntrack: true}},
		{Name: "lanekit-pod", ClientNS: "lk-n1-p1", ServerNS: "lk-n2-p1", ServerIP: "10.244.2.2",
			Includes: Includes{BPF: true}},
	}
	all := []samples{
		{gbps: []float64{10, 5, 12}, p50: []float64{20, 40, 20}, p99: []float64{40, 80, 40},
			cps: []float64{1000, 500, 1000}, cpsConns: []float64{5000, 2500, 5000}, cpsErrs: []float64{0, 0, 0}},
		{gbps: []float64{7, 3.5, 8}, p50: []float64{30, 60, 30}, p99: []float64{60, 120, 60},
			cps: []float64{800, 400, 800}, cpsConns: []float64{4000, 2000, 4000}, cpsErrs: []float64{0, 3, 0}},
		{gbps: []float64{9, 4.5, nan}, p50: []float64{21, 42, 21}, p99: []float64{42, 84, 42},
			cps: []float64{1000, 500, 1000}, cpsConns: []float64{5000, 2500, 5000}, cpsErrs: []float64{1, 0, 4},
			errs: []string{"rep 3 tcp: boom"}},
	}
	return buildReport(paths, all, Options{Repeat: 3, Duration: time.Second, BusyCPUs: true})
}

func TestPairedRatios(t *testing.T) {
	r := pairedReport()
	lk := r.row("lanekit-pod")
	pr, ok := lk.Paired[RawPath]
	if !ok {
		t.Fatalf("no paired ratios to host-raw: %+v", lk.Paired)
	}
	// TCP: reps 1 and 2 pair (0.9, 0.9); rep 3 failed.
	if pr.TCPGbps == nil || math.Abs(pr.TCPGbps.Median-0.9) > 1e-9 || pr.TCPGbps.Min != pr.TCPGbps.Max {
		t.Errorf("tcp paired = %+v, want 0.9 flat", pr.TCPGbps)
	}
	if pr.RRP99us == nil || math.Abs(pr.RRP99us.Median-1.05) > 1e-9 {
		t.Errorf("p99 paired = %+v, want 1.05", pr.RRP99us)
	}
	if _, ok := lk.Paired[HostPath]; ok {
		t.Error("paired ratios to a host row that was not measured")
	}
	if lk.CPSErrors != 5 || lk.CPSConns != 12500 {
		t.Errorf("cps conns/errors = %d/%d, want 12500/5", lk.CPSConns, lk.CPSErrors)
	}
	if lk.Reps.TCPGbps[2] != nil || lk.Reps.TCPGbps[1] == nil || *lk.Reps.TCPGbps[1] != 4.5 {
		t.Errorf("tcp reps = %v", lk.Reps.TCPGbps)
	}
	if pairedRatio([]*float64{nil}, []*float64{nil}) != nil {
		t.Error("no pairs: want nil")
	}
}

func TestTargets(t *testing.T) {
	r := pairedReport()
	got := map[string]TargetResult{}
	for _, tr := range r.Targets {
		got[tr.Metric+"/"+tr.Ref] = tr
	}
	if len(got) != 4 {
		t.Fatalf("targets = %+v", r.Targets)
	}
	if tcp := got["tcp_gbps/host-raw"]; tcp.Met || tcp.Ratio == nil || tcp.Want != ">= 0.97" {
		t.Errorf("tcp 0.9 × raw: %+v, want missed", tcp)
	}
	if p99 := got["rr_p99_us/host-raw"]; !p99.Met || p99.Want != "<= 1.05" {
		t.Errorf("p99 1.05 × raw: %+v, want met", p99)
	}
	if c := got["cps/bridge-iptables"]; !c.Met || math.Abs(c.Ratio.Median-1.25) > 1e-9 {
		t.Errorf("cps 1.25 × bridge: %+v, want met", c)
	}
	if !strings.Contains(got["tcp_gbps/host-raw"].String(), "lanekit-pod TCP >= 0.97 × host-raw: 0.90 × (0.90–0.90), missed") {
		t.Errorf("target text %q", got["tcp_gbps/host-raw"].String())
	}
}

func TestPairedTableAndJSON(t *testing.T) {
	r := pairedReport()
	var buf bytes.Buffer
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"×host-raw", "conn errors", "includes",
		"includes: host-raw: node to node, no rules",
		"  none  ", "  BPF  ", "  netfilter+conntrack  ",
		"0.90 (0.90–0.90)",
		"target: lanekit-pod TCP >= 0.97 × host-raw",
		"SCHED_IDLE spinners",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	// The CPS errors column: lanekit-pod's row ends its numbers with 5.
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "lanekit-pod ") && !strings.Contains(l, "  5  ") {
			t.Errorf("lanekit-pod row without its 5 connection errors: %q", l)
		}
	}
	buf.Reset()
	if err := r.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		BusyCPUs bool `json:"busy_cpus"`
		Rows     []struct {
			Path     string                     `json:"path"`
			TCP      map[string]float64         `json:"tcp_gbps"`
			CPSErrs  int64                      `json:"cps_errors"`
			Includes map[string]any             `json:"includes"`
			Reps     map[string][]*float64      `json:"reps"`
			Paired   map[string]json.RawMessage `json:"paired_ratios"`
		} `json:"rows"`
		Targets []map[string]any `json:"targets"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("decode: %v\n%s", err, buf.String())
	}
	lk := doc.Rows[2]
	if !doc.BusyCPUs || lk.CPSErrs != 5 || lk.Includes["bpf"] != true || lk.Reps["tcp_gbps"][2] != nil ||
		lk.Paired[RawPath] == nil || lk.TCP["median"] != 6.75 || len(doc.Targets) != 4 {
		t.Errorf("json = %+v", doc)
	}
}

func TestCPSErrorKinds(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: every connection is refused
	res, err := RunCPS(context.Background(), addr, 100*time.Millisecond, 1)
	if err == nil || res.Errors == 0 || res.ErrorKinds["connection refused"] != res.Errors {
		t.Errorf("refused: %+v, %v", res, err)
	}
}
