package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"image/color"
	"image/png"
	"io"
	"math"
	"net"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestSummarize(t *testing.T) {
	tests := []struct {
		name string
		in   []float64
		want Summary
	}{
		{"empty", nil, Summary{}},
		{"one", []float64{3}, Summary{3, 3, 3}},
		{"odd", []float64{5, 1, 3}, Summary{1, 3, 5}},
		{"even", []float64{4, 1, 3, 2}, Summary{1, 2.5, 4}},
		{"nan ignored", []float64{math.NaN(), 2, 6}, Summary{2, 4, 6}},
		{"all nan", []float64{math.NaN()}, Summary{}},
	}
	for _, tt := range tests {
		if got := Summarize(tt.in); got != tt.want {
			t.Errorf("%s: Summarize(%v) = %+v, want %+v", tt.name, tt.in, got, tt.want)
		}
	}
	if !math.IsNaN(Ratio(1, 0)) || Ratio(3, 2) != 1.5 {
		t.Errorf("Ratio: got %v, %v", Ratio(1, 0), Ratio(3, 2))
	}
}

func TestParseIperf3(t *testing.T) {
	data, err := os.ReadFile("testdata/iperf3_client.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseIperf3(data)
	if err != nil {
		t.Fatalf("ParseIperf3: %v", err)
	}
	// end.sum_received.bits_per_second in the fixture is 19867515319.41005.
	if math.Abs(got-19.867515319) > 1e-6 {
		t.Errorf("gbps = %v, want 19.8675", got)
	}
	data, err = os.ReadFile("testdata/iperf3_error.json")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseIperf3(data); err == nil || !strings.Contains(err.Error(), "Connection refused") {
		t.Errorf("error report: got %v, want connection refused", err)
	}
	if _, err := ParseIperf3([]byte(`{"end":{}}`)); err == nil {
		t.Error("empty end: want error")
	}
	if _, err := ParseIperf3([]byte(`not json`)); err == nil {
		t.Error("garbage: want error")
	}
	got, err = ParseIperf3([]byte(`{"end":{"sum_sent":{"bits_per_second":2.5e9}}}`))
	if err != nil || got != 2.5 {
		t.Errorf("sender fallback: got %v, %v", got, err)
	}
}

func TestParseSockperf(t *testing.T) {
	data, err := os.ReadFile("testdata/sockperf_pp.txt")
	if err != nil {
		t.Fatal(err)
	}
	lat, err := ParseSockperf(data)
	if err != nil {
		t.Fatalf("ParseSockperf: %v", err)
	}
	if lat.P50 != 4.709 || lat.P99 != 11.573 || lat.Observations == 0 {
		t.Errorf("got %+v, want p50 4.709 p99 11.573 and observations", lat)
	}
	if lat.Received != 190739 { // the whole run's round trips: what the BPF cost per round trip divides by
		t.Errorf("received %d, want 190739 ([Total Run] ReceivedMessages)", lat.Received)
	}
	if _, err := ParseSockperf([]byte("sockperf: ---> percentile 50.000 = 3.1\n")); err == nil {
		t.Error("missing p99: want error")
	}
}

func TestListenInTable(t *testing.T) {
	table := []byte(`  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1451 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 0100007F:2B67 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 20 4 30 10 -1
`)
	if !listenInTable(table, 5201) {
		t.Error("port 5201 (0x1451) listens: want true")
	}
	if listenInTable(table, 11111) {
		t.Error("port 11111 (0x2B67) is established, not listening: want false")
	}
}

func TestCPUModel(t *testing.T) {
	info := []byte("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold\n")
	if got := cpuModel(info); got != "Intel(R) Xeon(R) Gold" {
		t.Errorf("cpuModel = %q", got)
	}
	m := DescribeMachine()
	if m.Cores < 1 || m.Kernel == "" {
		t.Errorf("DescribeMachine = %+v", m)
	}
}

func sampleReport() *Report {
	paths := []Path{
		{Name: "host", ClientNS: "lk-node1", ServerNS: "lk-node2", ServerIP: "10.77.0.2"},
		{Name: "bridge-iptables", ClientNS: "lk-n1-b1", ServerNS: "lk-n2-b1", ServerIP: "10.245.2.2"},
		{Name: "lanekit-pod", ClientNS: "lk-n1-p1", ServerNS: "lk-n2-p1", ServerIP: "10.244.2.2"},
	}
	nan := math.NaN()
	all := []samples{
		{gbps: []float64{10, 12, 11}, p50: []float64{20, 22, 21}, p99: []float64{40, 44, 42}, cps: []float64{1000, 1200, 1100}},
		{gbps: []float64{7, 8, 9}, p50: []float64{25, 26, 27}, p99: []float64{50, 52, nan}, cps: []float64{800, 900, 1000},
			errs: []string{"rep 3 rr: boom"}},
		{gbps: []float64{nan, nan, nan}, p50: []float64{21, nan, nan}, p99: []float64{43, nan, nan}, cps: []float64{1050, nan, nan}},
	}
	for i := range all {
		all[i].cpsConns = []float64{100, 100, 100}
		all[i].cpsErrs = []float64{0, 0, 0}
	}
	return buildReport(paths, all, Options{Repeat: 3, Duration: 2 * time.Second})
}

func TestReportJSON(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReport().WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Machine map[string]any `json:"machine"`
		Rows    []struct {
			Path   string              `json:"path"`
			TCP    map[string]float64  `json:"tcp_gbps"`
			P50    float64             `json:"rr_p50_us"`
			P99    float64             `json:"rr_p99_us"`
			CPS    float64             `json:"cps"`
			Ratio  map[string]*float64 `json:"ratio_to_host"`
			Errors []string            `json:"errors"`
		} `json:"rows"`
	}
	dec := json.NewDecoder(&buf)
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("decode: %v", err)
	}
	if dec.More() {
		t.Fatal("more than one JSON document")
	}
	if doc.Machine["kernel"] == nil || doc.Machine["cores"] == nil || doc.Machine["cpu_model"] == nil {
		t.Errorf("machine = %v", doc.Machine)
	}
	if len(doc.Rows) != 3 {
		t.Fatalf("rows = %d", len(doc.Rows))
	}
	h, b, l := doc.Rows[0], doc.Rows[1], doc.Rows[2]
	if h.Path != "host" || h.TCP["min"] != 10 || h.TCP["median"] != 11 || h.TCP["max"] != 12 {
		t.Errorf("host row = %+v", h)
	}
	if h.P50 != 21 || h.P99 != 42 || h.CPS != 1100 {
		t.Errorf("host medians = %v %v %v", h.P50, h.P99, h.CPS)
	}
	if r := b.Ratio["tcp_gbps"]; r == nil || math.Abs(*r-8.0/11) > 1e-9 {
		t.Errorf("bridge tcp ratio = %v", r)
	}
	if r := b.Ratio["rr_p99_us"]; r == nil || math.Abs(*r-51.0/42) > 1e-9 {
		t.Errorf("bridge p99 ratio = %v", r)
	}
	if len(b.Errors) != 1 {
		t.Errorf("bridge errors = %v", b.Errors)
	}
	if l.Ratio["tcp_gbps"] != nil {
		t.Errorf("lanekit tcp ratio without samples = %v, want null", *l.Ratio["tcp_gbps"])
	}
}

func TestReportTable(t *testing.T) {
	r := sampleReport()
	var buf bytes.Buffer
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"11.00 (10.00–12.00)", "1.00 (1.00–1.00)", "0.70 (0.67–0.82)", "error: bridge-iptables: rep 3 rr: boom", "lanekit-pod"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if !r.Failed() {
		t.Error("Failed() = false with a row error")
	}
}

func TestChart(t *testing.T) {
	// With guest rows the chart has a second row of panels; the guests'
	// scale (here 0.3 Gbit/s, 900 µs) does not squash the netns rows.
	withGuests := pairedReport()
	withGuests.Rows = append(withGuests.Rows,
		Row{Path: "lanekit-vm", Server: "guest:vm1", TCPGbps: Summary{0.2, 0.3, 0.35},
			RRP50us: 900, RRP99us: 2500, CPSRange: Summary{150, 160, 170}},
		Row{Path: "bridge-tap-vm", Server: "guest:vm-std", TCPGbps: Summary{0.1, 0.2, 0.25},
			RRP50us: 1100, RRP99us: 3000, CPSRange: Summary{100, 120, 130}})
	for _, c := range []struct {
		name      string
		r         *Report
		panelRows int
	}{{"netns", pairedReport(), 1}, {"guests", withGuests, 2}} {
		panelH := max(chartPanelMin, chartRowH*3) // 3 netns rows at most
		var buf bytes.Buffer
		if err := c.r.WriteChart(&buf); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if dir := os.Getenv("LANEKIT_CHART_DIR"); dir != "" { // to look at it
			_ = os.WriteFile(dir+"/chart-"+c.name+".png", buf.Bytes(), 0o644)
		}
		img, err := png.Decode(&buf)
		if err != nil {
			t.Fatalf("%s: decode png: %v", c.name, err)
		}
		if b := img.Bounds(); b.Dx() != chartW || b.Dy() != chartHeaderH+panelH*c.panelRows {
			t.Errorf("%s: size %v, want %dx%d", c.name, b, chartW, chartHeaderH+panelH*c.panelRows)
		}
		seen := map[color.RGBA]bool{}
		b := img.Bounds()
		for y := b.Min.Y; y < b.Max.Y; y++ {
			for x := b.Min.X; x < b.Max.X; x++ {
				r, g, bl, a := img.At(x, y).RGBA()
				seen[color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(bl >> 8), uint8(a >> 8)}] = true
			}
		}
		for _, want := range []color.RGBA{colourMedian, colourP50, colourP99} {
			if !seen[want] {
				t.Errorf("%s: bar colour %v missing", c.name, want)
			}
		}
	}
	if err := (&Report{}).WriteChart(io.Discard); err == nil {
		t.Error("chart of an empty report: no error")
	}
}

func TestCPSLoopback(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeCPS(ctx, ln) }()
	res, err := RunCPS(context.Background(), ln.Addr().String(), 300*time.Millisecond, 2)
	cancel()
	if err != nil {
		t.Fatalf("RunCPS: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("ServeCPS: %v", err)
	}
	if res.Conns < 10 || res.CPS <= 0 || res.Seconds < 0.3 {
		t.Errorf("result = %+v", res)
	}
	// connect() times: recorded, ordered, and each shorter than a whole
	// exchange on average (two loops: 2/CPS seconds per exchange).
	if res.ConnectP50Us <= 0 || res.ConnectP99Us < res.ConnectP50Us || res.ConnectP50Us > 2e6/res.CPS {
		t.Errorf("connect p50 %.1f µs, p99 %.1f µs at %.0f conn/s", res.ConnectP50Us, res.ConnectP99Us, res.CPS)
	}
	line, _ := json.Marshal(res)
	back, err := ParseCPS(line)
	if err != nil || !reflect.DeepEqual(back, res) {
		t.Errorf("ParseCPS round trip = %+v, %v", back, err)
	}
}

// addCPS fills the current repetition and sums the error kinds over
// repetitions (both the pod and the service benchmarks record through it).
func TestSamplesAddCPS(t *testing.T) {
	s := newSamples(2)
	if err := s.addCPS([]byte(`{"conns":100,"errors":2,"seconds":1,"cps":98,"error_kinds":{"reset":2}}`)); err != nil {
		t.Fatal(err)
	}
	s.cur = 1
	if err := s.addCPS([]byte(`{"conns":50,"errors":3,"seconds":1,"cps":47,"error_kinds":{"reset":1,"timeout":2}}`)); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(s.cps, []float64{98, 47}) || !reflect.DeepEqual(s.cpsConns, []float64{100, 50}) ||
		!reflect.DeepEqual(s.cpsErrs, []float64{2, 3}) || !reflect.DeepEqual(s.cpsKinds, map[string]int64{"reset": 3, "timeout": 2}) {
		t.Errorf("samples = cps %v conns %v errs %v kinds %v", s.cps, s.cpsConns, s.cpsErrs, s.cpsKinds)
	}
	if err := s.addCPS([]byte("not json")); err == nil {
		t.Error("bad output accepted")
	}
}
