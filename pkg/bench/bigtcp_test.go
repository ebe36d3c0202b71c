package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func bigRow(name string, on, off, onBPP, offBPP []*float64) BigTCPRow {
	return BigTCPRow{Name: name, Reps: BigTCPReps{OnGbps: on, OffGbps: off, OnBytesPerPacket: onBPP, OffBytesPerPacket: offBPP}}
}

// The section's summaries, paired on/off ratios and verdicts come from the
// per-repetition values, survive the JSON document (--from recomputes
// them) and are printed with the row names.
func TestBigTCPReport(t *testing.T) {
	rep := &Report{Repeat: 3, DurationS: 5, BigTCP: &BigTCPReport{Repeat: 3, Detail: "IPv4 196608, IPv6 196608 (eth0: tso_max_size 524280)",
		Devices: []string{"lk-node1 eth0: gso 196608 gro 196608 gso_ipv4 196608 gro_ipv4 196608"},
		Rows: []BigTCPRow{
			// on/off 2, 2 (the failed third repetition is left out), 1.5
			bigRow("lanekit-pod same-node 1 stream", ptrs(40, 50, 45), []*float64{ptrs(20)[0], ptrs(25)[0], nil},
				ptrs(130000, 120000, 125000), ptrs(60000, 65536, 62000)),
			// a packet average above 64 KiB with BIG TCP "off": not verified
			bigRow("lanekit-pod cross-node 8 streams", ptrs(30, 30, 30), ptrs(20, 20, 20),
				ptrs(130000, 120000, 125000), ptrs(60000, 70000, 62000)),
			// no "off" measurement at all: not verified either
			bigRow("lanekit-pod cross-node 1 stream", ptrs(30, 30, 30), []*float64{nil, nil, nil},
				ptrs(130000, 120000, 125000), []*float64{nil, nil, nil}),
		}}}
	var doc bytes.Buffer
	if err := rep.WriteJSON(&doc); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(doc.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	back.ComputeRatios() // what --from does
	b := back.BigTCP
	if b == nil || len(b.Rows) != 3 {
		t.Fatalf("big_tcp after the round trip: %+v", b)
	}
	r0 := b.Rows[0]
	if r0.OnGbps != (Summary{40, 45, 50}) || r0.OffGbps != (Summary{20, 22.5, 25}) {
		t.Errorf("on %+v off %+v", r0.OnGbps, r0.OffGbps)
	}
	if r0.Ratio == nil || *r0.Ratio != (Summary{2, 2, 2}) {
		t.Errorf("paired on/off %+v, want 2 (2–2) from the two repetitions with both", r0.Ratio)
	}
	if r0.OnBytesPerPacket.Median != 125000 || r0.OffBytesPerPacket.Max != 65536 {
		t.Errorf("bytes per packet on %+v off %+v", r0.OnBytesPerPacket, r0.OffBytesPerPacket)
	}
	if !r0.Verified || b.Rows[1].Verified || b.Rows[2].Verified {
		t.Errorf("verified %v %v %v, want true false false", r0.Verified, b.Rows[1].Verified, b.Rows[2].Verified)
	}
	if !back.Failed() {
		t.Error("a row whose sizes do not show BIG TCP on and off does not fail the run")
	}
	var out strings.Builder
	if err := back.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"lanekit-pod same-node 1 stream (BIG TCP on/off)", "45.00 (40.00–50.00)", "22.50 (20.00–25.00)",
		"2.00 (2.00–2.00)", "125000 (120000–130000)", "BIG TCP packets seen on, none off", "NOT VERIFIED",
		"eth0: tso_max_size 524280", "as found: lk-node1 eth0: gso 196608"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	b.Rows = b.Rows[:1]
	if back.Failed() {
		t.Error("a verified row without errors fails the run")
	}
}

// fakeSwitch records Set calls and fails them: no measurement runs.
type fakeSwitch struct{ sets []bool }

func (f *fakeSwitch) Set(_ context.Context, on bool) error {
	f.sets = append(f.sets, on)
	return errors.New("netlink says no")
}

func (f *fakeSwitch) SenderCounters(context.Context, BigTCPCase) (uint64, uint64, error) {
	return 0, 0, errors.New("not reached")
}

// RunBigTCP alternates which mode comes first per repetition, ends with BIG
// TCP on, records a failed switch as every row's error, and measures no
// case of a family whose devices were not at BIG TCP sizes, saying why.
func TestRunBigTCPSwitching(t *testing.T) {
	c4 := BigTCPCase{Placement: "same-node", Family: "ipv4", Streams: 8, Path: Path{Name: "lanekit-pod"}}
	c6 := BigTCPCase{Placement: "same-node", Family: "ipv6", Streams: 1, Path: Path{Name: "lanekit-pod"}}
	sw := &fakeSwitch{}
	setup := BigTCPSetup{Active: map[string]bool{"ipv4": true}, Why: []string{"ipv6: BIG TCP was not active: 64 KiB or less on lk-node1 eth0"}}
	rep, err := RunBigTCP(context.Background(), []BigTCPCase{c4, c6}, sw, setup, Options{Repeat: 3, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if want := []bool{true, false, false, true, true, false, true}; !reflect.DeepEqual(sw.sets, want) {
		t.Errorf("Set calls %v, want %v (on/off, off/on, on/off, then on)", sw.sets, want)
	}
	if len(rep.Rows) != 1 || rep.Rows[0].Name != "lanekit-pod same-node 8 streams" || len(rep.Rows[0].Errors) != 6 {
		t.Fatalf("rows %+v: want the IPv4 row with 6 errors", rep.Rows)
	}
	if !rep.Failed() {
		t.Error("failed measurements do not fail the section")
	}
	skipped := strings.Join(rep.Skipped, "\n")
	if !strings.Contains(skipped, "lanekit-pod same-node 1 stream ipv6: BIG TCP was not active for ipv6") ||
		!strings.Contains(skipped, "64 KiB or less on lk-node1 eth0") {
		t.Errorf("skipped: %q", skipped)
	}

	// Nothing active: nothing switched, nothing measured.
	sw = &fakeSwitch{}
	rep, err = RunBigTCP(context.Background(), []BigTCPCase{c4}, sw, BigTCPSetup{}, Options{Repeat: 3})
	if err != nil || len(sw.sets) != 0 || len(rep.Rows) != 0 || len(rep.Skipped) != 1 {
		t.Errorf("inactive: err %v sets %v rows %d skipped %v", err, sw.sets, len(rep.Rows), rep.Skipped)
	}
}
