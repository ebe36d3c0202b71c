package datapath

import (
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/lanekit/lanekit/pkg/service"
)

// putMap writes the entries of m (an IPv6 service table of service.Update:
// its types mirror bpf/lib/lb6.h 1:1) in one batch.
func putMap[K comparable, V any](mp *ebpf.Map, m map[K]V) error {
	if len(m) == 0 {
		return nil
	}
	keys := make([]K, 0, len(m))
	vals := make([]V, 0, len(m))
	for k, v := range m {
		keys = append(keys, k)
		vals = append(vals, v)
	}
	return batchPut(mp, keys, vals)
}

// putSrcRanges adds source-range entries (service.SrcRangeKey, both
// families) to lk_lb_src_range, one by one (an LPM trie has no batch
// update; a frontend has few ranges).
func (l *Loader) putSrcRanges(keys []service.SrcRangeKey) error {
	for _, k := range keys {
		if err := l.pod.LkLbSrcRange.Put(k, uint8(1)); err != nil {
			return fmt.Errorf("source range of frontend %d: %w", k.FrontendID, err)
		}
	}
	return nil
}
