package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

var nativeEndian = binary.NativeEndian

// Metric kinds: enum lk_metric_kind in bpf/lib/consts.h (generated).
const (
	metricFromEP   = uint32(podLkMetricKindMETRIC_FROM_EP)
	metricToEP     = uint32(podLkMetricKindMETRIC_TO_EP)
	metricToStack  = uint32(podLkMetricKindMETRIC_TO_STACK)
	metricDropBase = uint32(podLkMetricKindMETRIC_DROP_BASE)

	// maxEndpoints is LK_MAX_ENDPOINTS in bpf/lib/consts.h (lk_endpoints).
	maxEndpoints = 4096
	// metricDropKinds is how many drop reasons (0..metricDropKinds-1) each
	// endpoint gets a counter slot for; DropReason values stay below it.
	metricDropKinds = 27
	// metricKinds is the number of counter keys one endpoint can have.
	metricKinds = 3 + metricDropKinds
	// MetricsMaxEntries sizes lk_metrics so that every endpoint the maps can
	// hold (plus endpoint 0, drops of unknown origin) can have every counter:
	// the programs' inserts cannot fail for lack of room.
	MetricsMaxEntries = (maxEndpoints + 1) * metricKinds
)

// sizeMetrics sets lk_metrics' size in a collection spec before it is
// loaded (every object that shares the pinned map must ask for the same size).
func sizeMetrics(spec *ebpf.CollectionSpec) {
	if m, ok := spec.Maps["lk_metrics"]; ok {
		m.MaxEntries = MetricsMaxEntries
	}
}

// metricKeys returns the counter keys endpoint id can have.
func metricKeys(id uint32) []podMetricsKey {
	keys := []podMetricsKey{{EpId: id, Kind: metricFromEP}, {EpId: id, Kind: metricToEP}, {EpId: id, Kind: metricToStack}}
	for r := uint32(0); r < metricDropKinds; r++ {
		keys = append(keys, podMetricsKey{EpId: id, Kind: metricDropBase + r})
	}
	return keys
}

// add folds one entry (per-CPU values) into c.
func (c *Counters) add(kind uint32, vals []podMetricsVal) {
	var pk, by uint64
	for _, v := range vals {
		pk += v.Packets
		by += v.Bytes
	}
	switch {
	case kind == metricFromEP:
		c.FromPackets, c.FromBytes = pk, by
	case kind == metricToEP:
		c.ToPackets, c.ToBytes = pk, by
	case kind == metricToStack:
		c.StackPackets, c.StackBytes = pk, by
	case kind >= metricDropBase:
		c.Drops[DropReason(kind-metricDropBase)] += pk
	}
}

// Counters returns endpoint id's counters summed over CPUs, looking its keys
// up directly. Drops not attributable to any endpoint are reported under id 0.
func (l *Loader) Counters(id uint32) (Counters, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return sumCounters(l.pod.LkMetrics, id)
}

// sumCounters sums endpoint id's entries of an lk_metrics map over CPUs.
func sumCounters(m *ebpf.Map, id uint32) (Counters, error) {
	c := Counters{Drops: map[DropReason]uint64{}}
	var vals []podMetricsVal
	for _, k := range metricKeys(id) {
		err := m.Lookup(k, &vals)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return Counters{}, fmt.Errorf("read counters of endpoint %d: %w", id, err)
		}
		c.add(k.Kind, vals)
	}
	return c, nil
}

// AllCounters returns every endpoint's counters in one walk of lk_metrics.
func (l *Loader) AllCounters() (map[uint32]Counters, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[uint32]Counters{}
	var (
		key  podMetricsKey
		vals []podMetricsVal
	)
	it := l.pod.LkMetrics.Iterate()
	for it.Next(&key, &vals) {
		c, ok := out[key.EpId]
		if !ok {
			c = Counters{Drops: map[DropReason]uint64{}}
		}
		c.add(key.Kind, vals)
		out[key.EpId] = c
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read counters: %w", err)
	}
	return out, nil
}

// MetricsUsage returns how many counter entries lk_metrics holds, its
// capacity, and how many counter updates the programs could not record
// because it was full (lk_metrics_lost, summed over CPUs).
func (l *Loader) MetricsUsage() (entries, capacity int, lost uint64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, err := countEntries(l.pod.LkMetrics) // keys only: per-CPU values need not be read
	if err != nil {
		return 0, 0, 0, fmt.Errorf("count counters: %w", err)
	}
	var perCPU []uint64
	if err := l.pod.LkMetricsLost.Lookup(uint32(0), &perCPU); err != nil {
		return 0, 0, 0, fmt.Errorf("read lost counter updates: %w", err)
	}
	for _, v := range perCPU {
		lost += v
	}
	return n, int(l.pod.LkMetrics.MaxEntries()), lost, nil
}

func (l *Loader) deleteMetrics(id uint32) error {
	for _, k := range metricKeys(id) {
		if err := deleteIgnoreMissing(l.pod.LkMetrics, k); err != nil {
			return err
		}
	}
	return nil
}
