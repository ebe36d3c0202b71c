package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func objectKeys(t *testing.T, s *Store) []string {
	t.Helper()
	var keys []string
	err := s.View(func(tx *Tx) error {
		return tx.ForEach(Objects, func(k []byte, _ json.RawMessage) error {
			keys = append(keys, string(k))
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestReplaceKind: a kind's stored set is replaced whole, beside the other
// kinds, in transactions of a bounded size swapped in at once, with the
// caller's final step in the swap's transaction; a failure changes nothing.
func TestReplaceKind(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Update(func(tx *Tx) error {
		for _, k := range []string{"Service/ns/a", "Service/ns/old", "Pod/ns/p"} {
			if err := tx.Put(Objects, []byte(k), json.RawMessage(`{"old":true}`)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	n := 3*replaceChunk + 5
	key := func(i int) []byte { return fmt.Appendf(nil, "Service/ns/s-%05d", i) }
	var writes []int64
	item := func(i int) ([]byte, json.RawMessage, error) {
		if i%replaceChunk == 0 {
			st := s.db.Stats()
			writes = append(writes, st.TxStats.GetWrite())
		}
		if i == 0 {
			return []byte("Service/ns/a"), json.RawMessage(`{"new":true}`), nil
		}
		return key(i), json.RawMessage(`{"new":true}`), nil
	}
	finalRan := false
	err = s.ReplaceKind("Service", n, item, func(tx *Tx) error {
		finalRan = true
		return tx.Put(Meta, []byte("m"), 1)
	})
	if err != nil {
		t.Fatal(err)
	}
	keys := objectKeys(t, s)
	if len(keys) != n+1 || !slices.Contains(keys, "Pod/ns/p") || slices.Contains(keys, "Service/ns/old") || !slices.IsSorted(keys) {
		t.Errorf("%d keys (want %d: the new Services and the Pod, in order), old Service kept: %v", len(keys), n+1, slices.Contains(keys, "Service/ns/old"))
	}
	var v map[string]bool
	if err := s.View(func(tx *Tx) error {
		if n, _ := tx.Count(Objects); n != len(keys) {
			t.Errorf("Count %d, ForEach %d", n, len(keys))
		}
		_, err := tx.Get(Objects, []byte("Service/ns/a"), &v)
		return err
	}); err != nil || !v["new"] {
		t.Errorf("Service/ns/a = %v (%v), want the new one", v, err)
	}
	if !finalRan {
		t.Error("final did not run")
	}
	if len(writes) != 4 || !slices.IsSorted(writes) || writes[0] == writes[3] || writes[1] == writes[2] {
		t.Errorf("page writes seen at each chunk's first object %v: want them to grow, one transaction per chunk", writes)
	}
	// A failure part-way: the stored set stays as it was, nothing staged.
	boom := errors.New("boom")
	err = s.ReplaceKind("Service", n, func(i int) ([]byte, json.RawMessage, error) {
		if i == 2*replaceChunk+1 {
			return nil, nil, boom
		}
		return fmt.Appendf(nil, "Service/ns/x-%05d", i), json.RawMessage(`{}`), nil
	}, nil)
	if !errors.Is(err, boom) {
		t.Fatalf("failed replace: %v, want boom", err)
	}
	if got := objectKeys(t, s); !slices.Equal(got, keys) {
		t.Errorf("a failed replace changed the stored objects: %d keys, want %d", len(got), len(keys))
	}
	if err := s.View(func(tx *Tx) error {
		if tx.tx.Bucket([]byte(staging)) != nil {
			return errors.New("staging left behind")
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	// A key of another kind is refused.
	if err := s.ReplaceKind("Service", 1, func(int) ([]byte, json.RawMessage, error) { return []byte("Pod/ns/q"), json.RawMessage(`{}`), nil }, nil); err == nil {
		t.Error("a Pod accepted in a replace of Services")
	}
}

// TestOpenMigratesFlatObjects: objects an older agent stored in one flat
// bucket are read back (and moved into their kinds' buckets); what a crash
// left in staging is dropped.
func TestOpenMigratesFlatObjects(t *testing.T) {
	dir := t.TempDir()
	db, err := bolt.Open(filepath.Join(dir, FileName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte(Objects))
		if err != nil {
			return err
		}
		for _, k := range []string{"Service/ns/a", "EndpointSlice/ns/a-1", "Pod/ns/p"} {
			if err := b.Put([]byte(k), []byte(`{"k":"`+k+`"}`)); err != nil {
				return err
			}
		}
		st, err := tx.CreateBucket([]byte(staging))
		if err != nil {
			return err
		}
		sb, err := st.CreateBucket([]byte("Service"))
		if err != nil {
			return err
		}
		return sb.Put([]byte("ns/half-written"), []byte(`{}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, want := objectKeys(t, s), []string{"EndpointSlice/ns/a-1", "Pod/ns/p", "Service/ns/a"}; !slices.Equal(got, want) {
		t.Errorf("objects after the migration %v, want %v", got, want)
	}
	var v map[string]string
	if err := s.View(func(tx *Tx) error { _, err := tx.Get(Objects, []byte("Pod/ns/p"), &v); return err }); err != nil || v["k"] != "Pod/ns/p" {
		t.Errorf("Pod/ns/p = %v %v", v, err)
	}
	err = s.View(func(tx *Tx) error {
		flat := 0
		tx.tx.Bucket([]byte(Objects)).ForEach(func(k, v []byte) error {
			if v != nil {
				flat++
			}
			return nil
		})
		if flat > 0 || tx.tx.Bucket([]byte(staging)) != nil {
			return fmt.Errorf("%d flat keys left, staging %v", flat, tx.tx.Bucket([]byte(staging)) != nil)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}
