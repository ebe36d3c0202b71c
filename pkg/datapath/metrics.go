package datapath

import (
	"encoding/binary"
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
)

// Counters returns endpoint id's counters summed over CPUs. Drops not
// attributable to any endpoint are reported under id 0.
func (l *Loader) Counters(id uint32) (Counters, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return sumCounters(l.pod.LkMetrics, id)
}

// sumCounters sums endpoint id's entries of an lk_metrics map over CPUs.
func sumCounters(m *ebpf.Map, id uint32) (Counters, error) {
	c := Counters{Drops: map[DropReason]uint64{}}
	var (
		key  podMetricsKey
		vals []podMetricsVal
	)
	it := m.Iterate()
	for it.Next(&key, &vals) {
		if key.EpId != id {
			continue
		}
		var pk, by uint64
		for _, v := range vals {
			pk += v.Packets
			by += v.Bytes
		}
		switch {
		case key.Kind == metricFromEP:
			c.FromPackets, c.FromBytes = pk, by
		case key.Kind == metricToEP:
			c.ToPackets, c.ToBytes = pk, by
		case key.Kind == metricToStack:
			c.StackPackets, c.StackBytes = pk, by
		case key.Kind >= metricDropBase:
			c.Drops[DropReason(key.Kind-metricDropBase)] += pk
		}
	}
	if err := it.Err(); err != nil {
		return Counters{}, fmt.Errorf("read counters of endpoint %d: %w", id, err)
	}
	return c, nil
}

func (l *Loader) deleteMetrics(id uint32) error {
	var (
		key  podMetricsKey
		vals []podMetricsVal
		del  []podMetricsKey
	)
	it := l.pod.LkMetrics.Iterate()
	for it.Next(&key, &vals) {
		if key.EpId == id {
			del = append(del, key)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("scan counters: %w", err)
	}
	for _, k := range del {
		if err := deleteIgnoreMissing(l.pod.LkMetrics, k); err != nil {
			return err
		}
	}
	return nil
}
