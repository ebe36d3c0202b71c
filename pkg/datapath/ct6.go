package datapath

import (
	"fmt"
	"time"

	"github.com/cilium/ebpf"
)

// gcCT removes the expired entries of one conntrack table (lk_ct4 keyed by
// podCtKey, lk_ct6 by podCt6Key: bpf/lib/ct.h keeps one entry layout and
// one set of timeouts for both families) and re-bases the live count the
// datapath keeps in count (created - evicted - GC removed) on what the walk
// found. Returns how many entries it removed. Called with l.mu.
func gcCT[K any](m, count *ebpf.Map, now uint64, proto func(K) uint8) (int, error) {
	var (
		expired []K
		live    uint64
	)
	isExpired := func(k K, v podCtEntry) bool {
		return now > v.LastSeen && time.Duration(now-v.LastSeen) > ctTimeout(proto(k), v.Flags)
	}
	visit := func(k K, v podCtEntry) {
		if isExpired(k, v) {
			expired = append(expired, k)
		} else {
			live++
		}
	}
	if err := walkCT(m, visit); err != nil {
		return 0, err
	}
	removed, err := deleteExpiredCT(m, expired, isExpired)
	if err != nil {
		return removed, fmt.Errorf("delete: %w", err)
	}
	live += uint64(len(expired) - removed) // refreshed since the walk, kept
	var created, evicted uint64
	if err := count.Lookup(ctCountCreated, &created); err != nil {
		return removed, err
	}
	if err := count.Lookup(ctCountEvicted, &evicted); err != nil {
		return removed, err
	}
	var base uint64
	if created > evicted+live {
		base = created - evicted - live
	}
	if err := count.Put(ctCountGCRemoved, base); err != nil {
		return removed, err
	}
	return removed, nil
}
