package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

type rec struct {
	Name string `json:"name"`
	N    int    `json:"n"`
}

func TestPutGetDeleteSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Update(func(tx *Tx) error {
		if err := tx.Put(Endpoints, []byte("b"), rec{"b", 2}); err != nil {
			return err
		}
		return tx.Put(Endpoints, []byte("a"), rec{"a", 1})
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var keys []string
	err = s.View(func(tx *Tx) error {
		var r rec
		ok, err := tx.Get(Endpoints, []byte("b"), &r)
		if err != nil || !ok || r != (rec{"b", 2}) {
			t.Errorf("get b after reopen = %v %v %v", r, ok, err)
		}
		if n, _ := tx.Count(Endpoints); n != 2 {
			t.Errorf("count = %d, want 2", n)
		}
		return tx.ForEach(Endpoints, func(k []byte, raw json.RawMessage) error {
			keys = append(keys, string(k))
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || keys[0] != "a" || keys[1] != "b" {
		t.Errorf("keys = %v, want [a b] in order", keys)
	}
	err = s.Update(func(tx *Tx) error {
		if err := tx.Delete(Endpoints, []byte("a")); err != nil {
			return err
		}
		return tx.Delete(Endpoints, []byte("missing"))
	})
	if err != nil {
		t.Fatalf("delete: %v", err)
	}
	s.View(func(tx *Tx) error {
		if ok, _ := tx.Has(Endpoints, []byte("a")); ok {
			t.Error("a still present after delete")
		}
		return nil
	})
}

func TestUpdateErrorRollsBack(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	boom := errors.New("boom")
	err = s.Update(func(tx *Tx) error {
		if err := tx.Put(IPAM, []byte{1}, rec{}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	s.View(func(tx *Tx) error {
		if ok, _ := tx.Has(IPAM, []byte{1}); ok {
			t.Error("put survived a failed transaction")
		}
		return nil
	})
}

func TestUnknownBucketAndSecondOpener(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.View(func(tx *Tx) error {
		_, err := tx.Get(Bucket("nope"), []byte("k"), &rec{})
		return err
	})
	if !errors.Is(err, ErrNoBucket) {
		t.Errorf("unknown bucket err = %v, want ErrNoBucket", err)
	}
	if s2, err := Open(dir); err == nil {
		s2.Close()
		t.Error("second Open of a locked db succeeded")
	}
}

// rssFile is the process's file-backed resident set (bytes).
func rssFile(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, "RssFile:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Skip("no RssFile in /proc/self/status")
	return 0
}

// A restore reads every stored record through bbolt's mapping: afterwards
// DropMappedPages takes those pages out of the resident set, and the
// records still read back.
func TestDropMappedPages(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n, size = 2000, 16 << 10 // 32 MB of values
	key := func(i int) []byte { return []byte(fmt.Sprintf("k%05d", i)) }
	if err := s.Update(func(tx *Tx) error {
		for i := range n {
			if err := tx.Put(Meta, key(i), rec{Name: strings.Repeat(string(rune('a'+i%26)), size), N: i}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	readAll := func() {
		t.Helper()
		if err := s.View(func(tx *Tx) error {
			for i := range n {
				var r rec
				if ok, err := tx.Get(Meta, key(i), &r); err != nil || !ok || r.N != i || len(r.Name) != size || r.Name[0] != byte('a'+i%26) {
					return fmt.Errorf("record %d: ok %v n %d len %d: %v", i, ok, r.N, len(r.Name), err)
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	readAll()
	before := rssFile(t)
	if err := s.DropMappedPages(); err != nil {
		t.Fatal(err)
	}
	after := rssFile(t)
	if before < after+n*size/2 {
		t.Errorf("file-backed RSS %d MB before, %d MB after: want the store's %d MB of pages out", before>>20, after>>20, n*size>>20)
	}
	readAll() // mapped in again
}
