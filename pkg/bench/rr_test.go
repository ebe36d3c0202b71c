package bench

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// TestRRPingPong runs the IPv6 rows' RR pair over loopback, both families:
// round trips counted, percentiles ordered, the client's JSON parsed back.
func TestRRPingPong(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Skipf("listen %s: %v", addr, err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- ServeRR(ctx, ln) }()
		res, err := RunRR(ctx, ln.Addr().String(), 200*time.Millisecond)
		cancel()
		<-done
		if err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		if res.Trips < 10 || res.P50us <= 0 || res.P99us < res.P50us {
			t.Fatalf("%s: %+v", addr, res)
		}
	}
	if _, err := RunRR(context.Background(), "127.0.0.1:1", 100*time.Millisecond); err == nil {
		t.Fatal("RR to a closed port succeeded")
	}
}

func TestRRResultAndParse(t *testing.T) {
	var rtts []time.Duration
	for i := 1; i <= 100; i++ {
		rtts = append(rtts, time.Duration(101-i)*time.Microsecond)
	}
	if r := rrResult(rtts); r.Trips != 100 || r.P50us != 50 || r.P99us != 99 {
		t.Fatalf("rrResult = %+v, want 100 trips, p50 50, p99 99", r)
	}
	if r, err := ParseRR([]byte(`{"trips":3,"p50_us":20.5,"p99_us":30}`)); err != nil || r.P50us != 20.5 {
		t.Fatalf("ParseRR = %+v %v", r, err)
	}
	for _, bad := range []string{`nope`, `{"trips":0,"p50_us":1,"p99_us":2}`, `{"trips":3,"p50_us":5,"p99_us":2}`} {
		if _, err := ParseRR([]byte(bad)); err == nil {
			t.Errorf("ParseRR(%s) accepted", bad)
		}
	}
}

// TestIPv6Rows: rows to an IPv6 server address are family ipv6 with the
// lanekit-rr tool; their table ratios and targets are to host-raw-ipv6,
// measured in the same repetitions as the IPv4 rows.
func TestIPv6Rows(t *testing.T) {
	paths := []Path{
		{Name: RawPath, ServerIP: "10.77.0.252"},
		{Name: "lanekit-pod", ServerIP: "10.244.2.2"},
		{Name: RawPath6, ServerIP: "fd00:77::f2"},
		{Name: "lanekit-pod-ipv6", ServerIP: "fd00:10:244:2::1"},
	}
	s := func(g, p50, p99, cps float64) samples {
		return samples{gbps: []float64{g, g}, p50: []float64{p50, p50}, p99: []float64{p99, p99}, cps: []float64{cps, cps},
			cpsConns: []float64{1, 1}, cpsErrs: []float64{0, 0}}
	}
	r := buildReport(paths, []samples{s(10, 20, 40, 1000), s(9, 22, 44, 900), s(8, 30, 60, 800), s(4, 60, 120, 400)},
		Options{Repeat: 2, Duration: time.Second})
	v6 := r.row("lanekit-pod-ipv6")
	if v6.Family != FamilyIPv6 || v6.RRTool != RRToolGo || r.row("lanekit-pod").RRTool != RRToolSockperf || r.row("lanekit-pod").Family != "" {
		t.Fatalf("families/tools: %+v / %+v", v6, r.row("lanekit-pod"))
	}
	if got := v6.Paired[RawPath6].TCPGbps; got == nil || got.Median != 0.5 {
		t.Fatalf("lanekit-pod-ipv6 TCP ratio to host-raw-ipv6 = %+v, want 0.5", got)
	}
	var b bytes.Buffer
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"0.50 (0.50–0.50)", "0.90 (0.90–0.90)", "IPv6 rows (-ipv6): ratios to host-raw-ipv6"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	met := map[string]bool{}
	for _, tr := range r.Targets {
		if tr.Path == "lanekit-pod-ipv6" {
			met[tr.Metric] = tr.Met
			if tr.Ref != RawPath6 {
				t.Errorf("IPv6 target %+v not against %s", tr, RawPath6)
			}
		}
	}
	if len(met) != 3 || met["tcp_gbps"] || met["rr_p99_us"] || met["cps"] {
		t.Errorf("IPv6 targets %v: want all three checked and missed (0.5 ×, 2 ×, 0.5 ×)", met)
	}
}
