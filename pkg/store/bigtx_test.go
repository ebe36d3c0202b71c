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

// TestPutRawIfChangedWritesOnlyChanges: a transaction putting back what the
// store holds writes no page but its meta and freelist pages; a changed value is written.
func TestPutRawIfChangedWritesOnlyChanges(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	put := func(val string) int64 {
		st := s.db.Stats()
		before := st.TxStats.GetWrite()
		err := s.Update(func(tx *Tx) error {
			for i := range 2000 {
				if err := tx.PutRawIfChanged(Objects, fmt.Appendf(nil, "Pod/ns/p-%04d", i), json.RawMessage(val)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		st = s.db.Stats()
		return st.TxStats.GetWrite() - before
	}
	first := put(`{"a":1}`)
	again := put(`{"a":1}`)
	changed := put(`{"a":2}`)
	t.Logf("page writes: first %d, unchanged %d, changed %d", first, again, changed)
	if again > 2 || changed < first/2 {
		t.Errorf("page writes: first %d, the same values again %d (want the meta and freelist pages only), changed values %d", first, again, changed)
	}
	var got json.RawMessage
	if ok, err := s.viewGet(Objects, []byte("Pod/ns/p-0007"), &got); !ok || err != nil || string(got) != `{"a":2}` {
		t.Errorf("p-0007 = %s %v %v, want the changed value", got, ok, err)
	}
}

// viewGet reads key in a read-only transaction.
func (s *Store) viewGet(b Bucket, key []byte, v any) (ok bool, err error) {
	err = s.View(func(tx *Tx) error {
		ok, err = tx.Get(b, key, v)
		return err
	})
	return ok, err
}
