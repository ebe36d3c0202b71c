package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/bench"
)

// bigTCPPair makes two named namespaces joined by a veth pair (10.99.7.1 and
// .2), both ends with the BIG TCP sizes the agent gives pod devices (192
// KiB), and removes them when the test ends.
func bigTCPPair(t *testing.T) (a, b string) {
	t.Helper()
	testutil.RequireRoot(t)
	lockLab()
	testutil.RequireTools(t, "ip", "iperf3")
	a, b = fmt.Sprintf("lkbt%d-a", os.Getpid()), fmt.Sprintf("lkbt%d-b", os.Getpid())
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	for _, ns := range []string{a, b} {
		run("netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	}
	run("-n", a, "link", "add", "bt0", "type", "veth", "peer", "name", "bt1", "netns", b)
	for _, e := range []struct{ ns, dev, ip string }{{a, "bt0", "10.99.7.1/24"}, {b, "bt1", "10.99.7.2/24"}} {
		run("-n", e.ns, "addr", "add", e.ip, "dev", e.dev)
		run("-n", e.ns, "link", "set", e.dev, "up")
		run("-n", e.ns, "link", "set", "lo", "up")
		big := gsoSizes{GSO: 196608, GRO: 196608, GSO4: 196608, GRO4: 196608}
		if found, err := readGSOSizes(e.ns, e.dev); err != nil {
			t.Fatal(err)
		} else if found.GSO4 == 0 {
			testutil.MissingDep(t, "the kernel has no gso_ipv4_max_size (Linux >= 6.3)")
		}
		if err := setGSOSizes(e.ns, e.dev, big); err != nil {
			t.Fatal(err)
		}
	}
	return a, b
}

// TestBigTCPSwitchVeth: the BIG TCP rows' switch reads a device's sizes as
// found (192 KiB, as the agent sets them: active for both families), Set(off)
// gives every device 64 KiB, Set(on) and Restore give back what it found, and
// a device the bench never switched off is left alone.
func TestBigTCPSwitchVeth(t *testing.T) {
	a, b := bigTCPPair(t)
	devs := []gsoDevice{{NS: a, Name: "bt0"}, {NS: b, Name: "bt1"}}
	sw, err := newGSOSwitch(devs)
	if err != nil {
		t.Fatal(err)
	}
	big := gsoSizes{GSO: 196608, GRO: 196608, GSO4: 196608, GRO4: 196608}
	off := gsoSizes{GSO: 65536, GRO: 65536, GSO4: 65536, GRO4: 65536}
	setup := sw.setup([]string{"ipv4", "ipv6"})
	if !setup.Active["ipv4"] || !setup.Active["ipv6"] || len(setup.Why) > 0 {
		t.Fatalf("setup %+v: want both families active", setup)
	}
	expect := func(when string, want gsoSizes) {
		t.Helper()
		for _, d := range devs {
			got, err := readGSOSizes(d.NS, d.Name)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("%s: %s holds %v, want %v", when, d, got, want)
			}
		}
	}
	ctx := context.Background()
	if err := sw.Set(ctx, false); err != nil {
		t.Fatal(err)
	}
	expect("off", off)
	if err := sw.Set(ctx, true); err != nil {
		t.Fatal(err)
	}
	expect("on", big)
	if err := sw.Set(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := sw.Restore(); err != nil {
		t.Fatal(err)
	}
	expect("restored", big)

	// A switch whose devices were found at 64 KiB says why it measures
	// nothing.
	if err := sw.Set(ctx, false); err != nil {
		t.Fatal(err)
	}
	low, err := newGSOSwitch(devs)
	if err != nil {
		t.Fatal(err)
	}
	st := low.setup([]string{"ipv4"})
	if st.Active["ipv4"] || len(st.Why) != 1 || !strings.Contains(st.Why[0], "bt0") || !strings.Contains(st.Why[0], "bt1") {
		t.Errorf("setup with 64 KiB devices: %+v, want ipv4 inactive naming both devices", st)
	}
	if err := sw.Restore(); err != nil {
		t.Fatal(err)
	}
	expect("restored again", big)
}

// vethCounters is the switch with the sender's counters taken from its veth
// (a veth counts each GSO packet once, like from_pod).
type vethCounters struct {
	*BigTCPSwitch
	ns, dev string
}

func (v vethCounters) SenderCounters(context.Context, bench.BigTCPCase) (pkts, bytes uint64, err error) {
	err = netlinkIn(v.ns, func(h *netlink.Handle) error {
		l, err := h.LinkByName(v.dev)
		if err != nil {
			return err
		}
		s := l.Attrs().Statistics
		pkts, bytes = s.TxPackets, s.TxBytes
		return nil
	})
	return pkts, bytes, err
}

// TestBigTCPRunVeth: bench.RunBigTCP with the switch over a veth pair
// measures both modes in every repetition, and the sender's packets average
// more than 64 KiB with BIG TCP on and at most 64 KiB off (the row is
// Verified only then); the devices hold their sizes as found afterwards.
func TestBigTCPRunVeth(t *testing.T) {
	a, b := bigTCPPair(t)
	sw, err := newGSOSwitch([]gsoDevice{{NS: a, Name: "bt0"}, {NS: b, Name: "bt1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sw.Restore(); err != nil {
			t.Error(err)
		}
	})
	cases := []bench.BigTCPCase{{Placement: "veth", Family: "ipv4", Streams: 1,
		Path: bench.Path{Name: "veth", ClientNS: a, ServerNS: b, ServerIP: "10.99.7.2"}}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := bench.RunBigTCP(ctx, cases, vethCounters{sw, a, "bt0"}, sw.setup([]string{"ipv4"}),
		bench.Options{Repeat: 2, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := rep.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	if len(rep.Rows) != 1 {
		t.Fatalf("%d rows, want 1", len(rep.Rows))
	}
	row := rep.Rows[0]
	if len(row.Errors) > 0 {
		t.Fatalf("errors: %v", row.Errors)
	}
	for i := range 2 {
		if row.Reps.OnGbps[i] == nil || row.Reps.OffGbps[i] == nil {
			t.Fatalf("rep %d: on %v off %v: want both measured", i+1, row.Reps.OnGbps[i], row.Reps.OffGbps[i])
		}
	}
	if !row.Verified || row.OnBytesPerPacket.Min <= 65536 || row.OffBytesPerPacket.Max > 65536 {
		t.Errorf("bytes per packet on %v off %v (verified %v): want > 64 KiB on, <= 64 KiB off",
			row.OnBytesPerPacket, row.OffBytesPerPacket, row.Verified)
	}
	if row.Ratio == nil {
		t.Error("no paired on/off ratio")
	}
	for _, d := range sw.devices {
		if got, err := readGSOSizes(d.NS, d.Name); err != nil || got != d.Found {
			t.Errorf("after the run %s holds %v (%v), want %v as found", d, got, err, d.Found)
		}
	}
}
