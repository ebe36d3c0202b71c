package datapath

import "github.com/cilium/ebpf"

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
