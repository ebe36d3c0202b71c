package store

import (
	"encoding/json"
	"errors"
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
