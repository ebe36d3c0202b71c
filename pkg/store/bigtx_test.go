package store

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// TestBigTransactionNotCopied: one transaction writing tens of megabytes
// (the agent's first full set of objects) allocates about what it writes,
// not a copy of it for each time the file outgrows its mapping.
func TestBigTransactionNotCopied(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n, size = 40000, 1000
	val := json.RawMessage(`"` + strings.Repeat("x", size-2) + `"`)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	err = s.Update(func(tx *Tx) error {
		for i := range n {
			if err := tx.Put(Objects, fmt.Appendf(nil, "EndpointSlice/ns/slice-%06d", i), val); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	written := float64(n * size)
	ratio := float64(after.TotalAlloc-before.TotalAlloc) / written
	t.Logf("allocated %.1f x the %.0f MB written", ratio, written/(1<<20))
	if ratio > 8 {
		t.Errorf("a %.0f MB transaction allocated %.1f x what it wrote, want <= 8: its keys and values copied at each remap?", written/(1<<20), ratio)
	}
}
