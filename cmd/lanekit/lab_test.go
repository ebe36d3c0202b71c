//go:build !nolab

package main

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanekit/lanekit/pkg/bench"
)

func TestBenchFromJSON(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "bench.json"), filepath.Join(dir, "bench.png")
	doc := `{"machine":{"kernel":"6.x","cpu_model":"cpu","cores":2},"repeat":3,"duration_s":5,"rows":[
	  {"path":"host-raw","server":"netns","tcp_gbps":{"min":9,"median":10,"max":11},"rr_p50_us":20,"rr_p99_us":40,"cps_range":{"min":1,"median":2,"max":3}},
	  {"path":"lanekit-vm","server":"guest:vm1","tcp_gbps":{"min":0.1,"median":0.2,"max":0.3},"rr_p50_us":900,"rr_p99_us":2000}]}`
	if err := os.WriteFile(in, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, other, err := loadReport(in)
	if err != nil || other != nil {
		t.Fatalf("a lab's report read as %T, %v", other, err)
	}
	if err := writeChart(rep, out); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatalf("not a png: %v", err)
	}
	if err := os.WriteFile(in, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := loadReport(in); err == nil || !strings.Contains(err.Error(), "parse") {
		t.Errorf("bad json: %v", err)
	}
}

// TestBenchFromCNIReports: `lab bench --from` prints the saved reports of
// --cni's own labs as the run printed them: each network's group table and
// the paired ratios across groups; the rival service rows' table.
func TestBenchFromCNIReports(t *testing.T) {
	out, err := runCLI(t, "lab", "bench", "--from", "../../docs/bench-rivals-tunnel.json")
	if err != nil {
		t.Fatalf("--from a --cni report: %v\n%s", err, out)
	}
	for _, want := range []string{"groups interleaved per repetition", "== lanekit", "== cilium", "paired across groups", "pod-cross-node"} {
		if !strings.Contains(out, want) {
			t.Errorf("--from a --cni report: no %q in\n%s", want, out)
		}
	}
	out, err = runCLI(t, "lab", "bench", "--from", "../../docs/bench-rivals-services.json")
	if err != nil {
		t.Fatalf("--from a --cni --services report: %v\n%s", err, out)
	}
	if !strings.Contains(out, "kube-proxy-iptables  10000") || !strings.Contains(out, "lanekit              10000") {
		t.Errorf("--from a --cni --services report: no network's rows in\n%s", out)
	}
	if out, err = runCLI(t, "lab", "bench", "--chart", filepath.Join(t.TempDir(), "c.png"), "--from", "../../docs/bench-rivals-tunnel.json"); err == nil {
		t.Errorf("--chart of a --cni report: no error\n%s", out)
	}
}

// TestGuestPaths: --vm-only keeps the guest rows and host-raw, in order.
func TestGuestPaths(t *testing.T) {
	g := &bench.Guest{}
	in := []bench.Path{{Name: bench.RawPath}, {Name: "host"}, {Name: "lanekit-pod"}, {Name: "lanekit-vm", Guest: g}, {Name: "bridge-tap-vm", Guest: g}}
	var got []string
	for _, p := range guestPaths(in) {
		got = append(got, p.Name)
	}
	if strings.Join(got, ",") != "host-raw,lanekit-vm,bridge-tap-vm" {
		t.Errorf("guestPaths kept %v", got)
	}
}
