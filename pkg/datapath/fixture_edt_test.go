package datapath

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// TestEDTFixtures: from_pod stamps the packets of an endpoint with an egress
// limit with departure times spaced at its rate (skb->tstamp, read back from
// BPF_PROG_TEST_RUN's context), leaves other endpoints' packets alone, and
// drops a packet its limit would hold past the horizon (bandwidth-horizon).
// fq, which paces by these stamps, is not in this kernel: the agent falls
// back to tbf there (pkg/agent TestEgressBandwidthLimit), and this is what
// keeps the EDT path honest.
func TestEDTFixtures(t *testing.T) {
	e := newFixtureEnv(t)
	e.enter(t)
	const ipLen = 1000
	frame := tcpFrame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.2.5", ipLen)
	run := func() (uint32, uint64) {
		t.Helper()
		ctx := skbCtx{Ifindex: uint32(e.h1.Attrs().Index)}
		var out skbCtx
		opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Context: ctx, ContextOut: &out}
		ret, err := e.dp.pod.FromPod.Run(opts)
		if err != nil {
			t.Fatalf("run: %v", err)
		}
		return ret, out.Tstamp
	}
	// No limit: no stamp.
	if ret, ts := run(); ret != tcActRedirect || ts != 0 {
		t.Fatalf("unlimited: verdict %d tstamp %d, want redirect and no stamp", ret, ts)
	}
	// 8 Mbit/s: 1 MB/s, a 1014-byte frame every 1.014 ms.
	if err := e.dp.SetEgressRate(1, 8_000_000); err != nil {
		t.Fatal(err)
	}
	if rates, err := e.dp.EgressRates(); err != nil || rates[1] != 8_000_000 {
		t.Fatalf("rates %v %v", rates, err)
	}
	var stamps []uint64
	for range 4 {
		ret, ts := run()
		if ret != tcActRedirect {
			t.Fatalf("limited: verdict %d, want redirect", ret)
		}
		stamps = append(stamps, ts)
	}
	// The first leaves now (no stamp); each later one 1.014 ms after the
	// one before (the runs take microseconds).
	step := uint64(len(frame)) * uint64(time.Second) / 1_000_000
	if stamps[0] != 0 || stamps[1] == 0 {
		t.Fatalf("stamps %v: want the first unstamped and the next stamped", stamps)
	}
	for i := 2; i < len(stamps); i++ {
		if d := stamps[i] - stamps[i-1]; d != step {
			t.Errorf("stamps %v: packet %d leaves %d ns after the one before, want %d", stamps, i, d, step)
		}
	}
	// Another endpoint's packets are not stamped.
	if err := e.dp.SetEgressRate(1, 0); err != nil {
		t.Fatal(err)
	}
	if ret, ts := run(); ret != tcActRedirect || ts != 0 {
		t.Fatalf("limit removed: verdict %d tstamp %d", ret, ts)
	}
	// 8 bit/s: the second packet would leave 1014 s from now, past the 2 s horizon.
	if err := e.dp.SetEgressRate(1, 8); err != nil {
		t.Fatal(err)
	}
	before, err := e.dp.Counters(1)
	if err != nil {
		t.Fatal(err)
	}
	run()
	if ret, _ := run(); ret != tcActShot {
		t.Fatalf("past the horizon: verdict %d, want drop", ret)
	}
	after, err := e.dp.Counters(1)
	if err != nil {
		t.Fatal(err)
	}
	if d := after.Drops[DropEDTHorizon] - before.Drops[DropEDTHorizon]; d != 1 {
		t.Errorf("bandwidth-horizon drops +%d, want 1", d)
	}
}
