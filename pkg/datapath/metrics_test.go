package datapath

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/internal/testutil"
)

func openMetricsLoader(t testing.TB) *Loader {
	t.Helper()
	testutil.RequireBPFFS(t)
	dir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("lk-t-metrics-%d", os.Getpid()))
	t.Cleanup(func() { Unpin(dir) }) // a failed Open may have pinned some maps
	l, err := Open(Config{PinDir: dir}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("open datapath: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func putMetric(t *testing.T, m *ebpf.Map, id, kind uint32, pkts uint64) {
	t.Helper()
	vals := make([]podMetricsVal, ebpf.MustPossibleCPU())
	vals[0] = podMetricsVal{Packets: pkts, Bytes: pkts * 100}
	vals[len(vals)-1].Packets += pkts // a second CPU's share (or the same one)
	if err := m.Put(podMetricsKey{EpId: id, Kind: kind}, vals); err != nil {
		t.Fatalf("put metric %d/%#x: %v", id, kind, err)
	}
}

// TestCountersLookupAndWalk: direct lookups, the one-walk read and the
// per-endpoint delete agree on what the map holds.
func TestCountersLookupAndWalk(t *testing.T) {
	l := openMetricsLoader(t)
	m := l.pod.LkMetrics
	putMetric(t, m, 7, metricFromEP, 3)
	putMetric(t, m, 7, metricToEP, 5)
	putMetric(t, m, 7, metricDropBase+uint32(DropSpoofedIP), 2)
	putMetric(t, m, 8, metricToEP, 1)
	putMetric(t, m, 0, metricDropBase+uint32(DropUnknownEP), 4)
	cpus := uint64(1)
	if ebpf.MustPossibleCPU() > 1 {
		cpus = 2
	}
	c, err := l.Counters(7)
	if err != nil {
		t.Fatal(err)
	}
	if c.FromPackets != 3*cpus || c.ToPackets != 5*cpus || c.FromBytes != 300 || c.Drops[DropSpoofedIP] != 2*cpus || len(c.Drops) != 1 {
		t.Fatalf("counters of 7 = %+v", c)
	}
	all, err := l.AllCounters()
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 3 || all[7].ToPackets != c.ToPackets || all[8].ToPackets != cpus || all[0].Drops[DropUnknownEP] != 4*cpus {
		t.Fatalf("all counters = %+v", all)
	}
	if err := l.deleteMetrics(7); err != nil {
		t.Fatal(err)
	}
	all, _ = l.AllCounters()
	if _, ok := all[7]; ok || len(all) != 2 {
		t.Fatalf("after deleting 7's counters: %+v", all)
	}
}

// TestMetricsHoldEveryEndpoint: lk_metrics has room for every counter of
// every endpoint the endpoint maps can hold, plus endpoint 0.
func TestMetricsHoldEveryEndpoint(t *testing.T) {
	l := openMetricsLoader(t)
	m := l.pod.LkMetrics
	if got := int(m.MaxEntries()); got != MetricsMaxEntries {
		t.Fatalf("lk_metrics max entries %d, want %d", got, MetricsMaxEntries)
	}
	if got := int(l.pod.LkEndpoints.MaxEntries()); got != maxEndpoints {
		t.Fatalf("lk_endpoints holds %d, metrics sized for %d endpoints", got, maxEndpoints)
	}
	vals := make([]podMetricsVal, ebpf.MustPossibleCPU())
	for id := uint32(0); id <= maxEndpoints; id++ {
		for _, k := range metricKeys(id) {
			if err := m.Update(k, vals, ebpf.UpdateNoExist); err != nil {
				t.Fatalf("counter %d/%#x: %v", id, k.Kind, err)
			}
		}
	}
	n, capacity, _, err := l.MetricsUsage()
	if err != nil || n != MetricsMaxEntries || capacity != MetricsMaxEntries {
		t.Fatalf("usage = %d/%d %v, want full at %d", n, capacity, err, MetricsMaxEntries)
	}
}

// TestSweepCounters: counters of endpoints no record owns go, those of
// owned endpoints and of endpoint 0 stay.
func TestSweepCounters(t *testing.T) {
	l := openMetricsLoader(t)
	m := l.pod.LkMetrics
	putMetric(t, m, 7, metricToEP, 1)
	putMetric(t, m, 9, metricFromEP, 1)
	putMetric(t, m, 9, metricDropBase+uint32(DropSpoofedMAC), 1)
	putMetric(t, m, 0, metricDropBase+uint32(DropUnknownEP), 1)
	sw, err := l.Sweep(Owned{IDs: map[uint32]bool{7: true}})
	if err != nil {
		t.Fatal(err)
	}
	all, _ := l.AllCounters()
	if sw.Metrics != 2 || len(all) != 2 || all[7].ToPackets == 0 || all[0].Drops[DropUnknownEP] == 0 {
		t.Fatalf("swept %+v, left %+v", sw, all)
	}
}

// BenchmarkListCounters reads the counters of 1000 endpoints with lk_metrics
// holding every counter of every possible endpoint: one walk (what
// `endpoint list` does), direct lookups per endpoint, and a walk per
// endpoint (what it did before; 100 endpoints, it grows linearly).
func BenchmarkListCounters(b *testing.B) {
	l := openMetricsLoader(b)
	m := l.pod.LkMetrics
	vals := make([]podMetricsVal, ebpf.MustPossibleCPU())
	for id := uint32(0); id <= maxEndpoints; id++ {
		for _, k := range metricKeys(id) {
			if err := m.Put(k, vals); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("one-walk", func(b *testing.B) {
		for range b.N {
			if _, err := l.AllCounters(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("direct-x1000", func(b *testing.B) {
		for range b.N {
			for id := uint32(1); id <= 1000; id++ {
				if _, err := l.Counters(id); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("walk-per-endpoint-x100", func(b *testing.B) {
		for range b.N {
			for range 100 {
				if _, err := l.AllCounters(); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

// TestMetricsLostWhenFull: with lk_metrics full, an update that finds no room
// is counted in lk_metrics_lost (and reported by MetricsUsage), never silent;
// counters that already have an entry keep counting.
func TestMetricsLostWhenFull(t *testing.T) {
	e := newFixtureEnv(t)
	frame := testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.1.11", 64)
	// One counter that exists before the map fills: pod 1's "from" counter.
	if v := runPod(t, e, ifH1(e), frame); v != tcActRedirect {
		t.Fatalf("pod 1 to pod 2: verdict %d", v)
	}
	m := e.dp.pod.LkMetrics
	n, capacity, lost, err := e.dp.MetricsUsage()
	if err != nil || lost != 0 {
		t.Fatalf("usage before filling: %d/%d, %d lost, %v", n, capacity, lost, err)
	}
	vals := make([]podMetricsVal, ebpf.MustPossibleCPU())
	// Fill with ids no endpoint has, until the kernel refuses (E2BIG): the
	// hash may run out of free elements a little before max_entries.
	for id := uint32(1 << 20); ; id++ {
		err := m.Update(podMetricsKey{EpId: id, Kind: metricFromEP}, vals, ebpf.UpdateNoExist)
		if errors.Is(err, unix.E2BIG) {
			break
		}
		if err != nil || n > capacity {
			t.Fatalf("fill lk_metrics at %d/%d: %v", n, capacity, err)
		}
		n++
	}
	if n < capacity-ebpf.MustPossibleCPU() {
		t.Fatalf("lk_metrics refused new entries at %d of %d", n, capacity)
	}
	// The uplink is no endpoint: from_pod drops as unknown-endpoint, whose
	// counter (endpoint 0) has no entry and no room.
	for range 3 {
		if v := runPod(t, e, ifUp(e), frame); v != tcActShot {
			t.Fatalf("frame from a non-endpoint device: verdict %d, want drop", v)
		}
	}
	if v := runPod(t, e, ifH1(e), frame); v != tcActRedirect {
		t.Fatalf("pod 1 to pod 2 with the map full: verdict %d", v)
	}
	// At least the 3 drops: the kernel may also send IPv6 neighbour discovery
	// through the fixture's pod devices, whose drop counters have no room either.
	if _, _, lost, err = e.dp.MetricsUsage(); err != nil || lost < 3 {
		t.Fatalf("lost counter updates = %d (%v), want at least 3", lost, err)
	}
	if c, err := e.dp.Counters(0); err != nil || c.Drops[DropUnknownEP] != 0 {
		t.Fatalf("endpoint 0 counters %+v (%v): the drop had no room to be counted", c, err)
	}
	if c, err := e.dp.Counters(e.ep1.ID); err != nil || c.FromPackets != 2 {
		t.Fatalf("pod 1 counters %+v (%v): its existing entry must keep counting (want 2 sent)", c, err)
	}
}
