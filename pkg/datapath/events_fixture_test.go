package datapath

import (
	"bytes"
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/lanekit/lanekit/internal/testutil"
)

// runPod runs one frame through from_pod as if it entered on ifindex.
func runPod(t *testing.T, e *fixtureEnv, ifindex int, in []byte) uint32 {
	t.Helper()
	opts := &ebpf.RunOptions{Data: bytes.Clone(in), DataOut: make([]byte, len(in)+256), Context: skbCtx{Ifindex: uint32(ifindex)}}
	ret, err := e.dp.pod.FromPod.Run(opts)
	if err != nil {
		t.Fatalf("run from_pod: %v", err)
	}
	return ret
}

// readEvents returns every event already in the ring.
func readEvents(t testing.TB, r *EventReader) []Event {
	t.Helper()
	var evs []Event
	for {
		r.SetDeadline(time.Now())
		ev, err := r.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return evs
		}
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
}

// TestEventsFixture: a drop emits exactly one event with the packet's
// fields when drop events are on, and nothing at all (not even a reserved
// slot) when they are off; forwarded packets are reported only when
// sampling is on.
func TestEventsFixture(t *testing.T) {
	e := newFixtureEnv(t)
	r, err := OpenEvents(e.pinDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	spoofed := testutil.UDPFrame(e.ep1.HostMAC, pod1MAC, "10.244.1.99", "10.244.2.5", 64, make([]byte, 20))
	toPod2 := testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.1.11", 64)

	// Off (the state a fresh datapath starts in): drops are counted, not reported.
	if ret := runPod(t, e, ifH1(e), spoofed); ret != tcActShot {
		t.Fatalf("spoofed frame: verdict %d, want drop", ret)
	}
	if ret := runPod(t, e, ifH1(e), toPod2); ret != tcActRedirect {
		t.Fatalf("frame to pod 2: verdict %d, want redirect", ret)
	}
	if n := r.rd.AvailableBytes(); n != 0 {
		t.Fatalf("events off, but %d bytes were written to the ring", n)
	}
	if evs := readEvents(t, r); len(evs) != 0 {
		t.Fatalf("events off, but read %+v", evs)
	}

	// Drops on: exactly one event per drop, with the packet's fields; a
	// forwarded packet is not reported.
	if err := r.Configure(EventsConfig{Drops: true}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	runPod(t, e, ifH1(e), spoofed)
	runPod(t, e, ifH1(e), toPod2)
	evs := readEvents(t, r)
	if len(evs) != 1 {
		t.Fatalf("read %d events, want 1: %+v", len(evs), evs)
	}
	ev := evs[0]
	want := Event{Time: ev.Time, Kind: EventDrop, Reason: DropSpoofedIP, EndpointID: e.ep1.ID, IfIndex: uint32(ifH1(e)),
		Len: uint32(len(spoofed)), EtherType: 0x0800, Proto: 17,
		Src: netip.MustParseAddr("10.244.1.99"), Dst: netip.MustParseAddr("10.244.2.5"), SrcPort: 40000, DstPort: 5201}
	if ev != want {
		t.Fatalf("event\n got %+v\nwant %+v", ev, want)
	}
	if d := ev.Time.Sub(start); d < -time.Second || d > time.Minute {
		t.Errorf("event time %s is %s away from the test's clock", ev.Time, d)
	}

	// Forwarded sampling on (every packet): the delivery to pod 2 is reported.
	if err := r.Configure(EventsConfig{Forwarded: true, SampleRate: 1}); err != nil {
		t.Fatal(err)
	}
	runPod(t, e, ifH1(e), toPod2)
	runPod(t, e, ifH1(e), spoofed) // drops are off now
	evs = readEvents(t, r)
	if len(evs) != 1 || evs[0].Kind != EventForwarded || evs[0].EndpointID != e.ep1.ID || evs[0].PeerID != e.ep2.ID ||
		evs[0].Dst != netip.MustParseAddr("10.244.1.11") {
		t.Fatalf("forwarded events %+v, want one from endpoint %d to %d", evs, e.ep1.ID, e.ep2.ID)
	}

	// From the uplink into pod 1, and pod 1 to a remote pod (out of the
	// uplink): sampled too, with no sending / no receiving endpoint.
	fromWire := testutil.IPv4Frame(e.up.Attrs().HardwareAddr, neighMAC, "10.244.2.5", "10.244.1.10", 63)
	opts := &ebpf.RunOptions{Data: fromWire, DataOut: make([]byte, len(fromWire)+256), Context: skbCtx{Ifindex: uint32(ifUp(e))}}
	if ret, err := e.dp.uplink.FromUplink.Run(opts); err != nil || ret != tcActRedirect {
		t.Fatalf("uplink frame: verdict %d, %v", ret, err)
	}
	if ret := runPod(t, e, ifH1(e), testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.2.5", 64)); ret != tcActRedirect {
		t.Fatalf("frame to a remote pod: verdict %d, want redirect", ret)
	}
	evs = readEvents(t, r)
	if len(evs) != 2 || evs[0].EndpointID != 0 || evs[0].PeerID != e.ep1.ID || evs[0].IfIndex != uint32(ifUp(e)) ||
		evs[1].EndpointID != e.ep1.ID || evs[1].PeerID != 0 || evs[1].Dst != netip.MustParseAddr("10.244.2.5") {
		t.Fatalf("forwarded events %+v, want uplink -> endpoint %d, then endpoint %d -> remote", evs, e.ep1.ID, e.ep1.ID)
	}

	// One in N: over many packets, about 1/N of them (a loose bound: the
	// choice is random).
	if err := r.Configure(EventsConfig{Forwarded: true, SampleRate: 4}); err != nil {
		t.Fatal(err)
	}
	const sent = 400
	for i := 0; i < sent; i++ {
		runPod(t, e, ifH1(e), toPod2)
	}
	if n := len(readEvents(t, r)); n < sent/4/3 || n > sent/4*3 {
		t.Fatalf("1 in 4 of %d packets: %d events", sent, n)
	}

	// Off again: nothing more.
	if err := r.Configure(EventsConfig{}); err != nil {
		t.Fatal(err)
	}
	runPod(t, e, ifH1(e), spoofed)
	runPod(t, e, ifH1(e), toPod2)
	if evs := readEvents(t, r); len(evs) != 0 {
		t.Fatalf("events off, but read %+v", evs)
	}
	if lost, err := r.Lost(); err != nil || lost != 0 {
		t.Fatalf("lost = %d, %v; want 0", lost, err)
	}

	// Left on by an agent that died: a new datapath turns them off, and a
	// new reader skips what was written meanwhile.
	if err := r.Configure(EventsConfig{Drops: true}); err != nil {
		t.Fatal(err)
	}
	r.rd.Close() // the agent dies: nobody turns them off
	r.events.Close()
	r.cfg.Close()
	r.lost.Close()
	runPod(t, e, ifH1(e), spoofed)
	dp2, err := Open(Config{PinDir: e.pinDir, traceRedirects: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dp2.Close()
	if r, err = OpenEvents(e.pinDir); err != nil {
		t.Fatal(err)
	}
	runPod(t, e, ifH1(e), spoofed)
	if evs := readEvents(t, r); len(evs) != 0 {
		t.Fatalf("after a restart: read %+v, want nothing (stale event skipped, events off)", evs)
	}
}

// TestEventsRingFull: when the ring is full, events are counted lost.
func TestEventsRingFull(t *testing.T) {
	e := newFixtureEnv(t)
	r, err := OpenEvents(e.pinDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if err := r.Configure(EventsConfig{Drops: true}); err != nil {
		t.Fatal(err)
	}
	spoofed := testutil.UDPFrame(e.ep1.HostMAC, pod1MAC, "10.244.1.99", "10.244.2.5", 64, nil)
	// Each record takes its 48 bytes plus an 8-byte header.
	const perRecord = 56
	n := r.rd.BufferSize()/perRecord + 10
	opts := &ebpf.RunOptions{Data: spoofed, Context: skbCtx{Ifindex: uint32(ifH1(e))}, Repeat: uint32(n)}
	if _, err := e.dp.pod.FromPod.Run(opts); err != nil {
		t.Fatal(err)
	}
	lost, err := r.Lost()
	if err != nil {
		t.Fatal(err)
	}
	if got := uint64(len(readEvents(t, r))); got+lost != uint64(n) || lost == 0 {
		t.Fatalf("read %d events and %d lost, want %d in all with some lost", got, lost, n)
	}
}
