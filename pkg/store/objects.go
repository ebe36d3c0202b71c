package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// The Objects bucket holds one bucket per kind: key "Kind/namespace/name"
// is "namespace/name" in bucket "Kind". Callers see the whole keys (Put,
// Get, Delete, ForEach, Count on Objects). A kind's bucket can then be
// replaced whole (ReplaceKind): the new set is written beside it in
// transactions of a bounded size and swapped in by one small transaction,
// so a full set of tens of thousands of objects is stored atomically
// without one transaction holding all of it (bbolt keeps every value a
// transaction writes, then a page for it, until the commit).

// staging holds the kind being replaced until the swap (nothing else is
// ever in it; a crash can leave it behind, Open clears it).
const staging = "objects-staging"

// replaceChunk is how many objects one staging transaction writes.
const replaceChunk = 1024

// splitObjectKey splits "Kind/rest" into the kind's bucket name and the key
// in it.
func splitObjectKey(key []byte) ([]byte, []byte, error) {
	i := bytes.IndexByte(key, '/')
	if i <= 0 {
		return nil, nil, fmt.Errorf("object key %q: want Kind/namespace/name", key)
	}
	return key[:i], key[i+1:], nil
}

// objectBucket is the bucket of key's kind and the key in it; create makes
// a missing kind's bucket (nil without create).
func (t *Tx) objectBucket(key []byte, create bool) (*bolt.Bucket, []byte, error) {
	parent, err := t.bucket(Objects)
	if err != nil {
		return nil, nil, err
	}
	kind, sub, err := splitObjectKey(key)
	if err != nil {
		return nil, nil, err
	}
	if !create {
		return parent.Bucket(kind), sub, nil
	}
	b, err := parent.CreateBucketIfNotExists(kind)
	if err != nil {
		return nil, nil, fmt.Errorf("objects bucket %s: %w", kind, err)
	}
	return b, sub, nil
}

func (t *Tx) forEachObject(fn func(key []byte, raw json.RawMessage) error) error {
	parent, err := t.bucket(Objects)
	if err != nil {
		return err
	}
	return parent.ForEachBucket(func(kind []byte) error {
		return parent.Bucket(kind).ForEach(func(k, v []byte) error {
			key := make([]byte, 0, len(kind)+1+len(k))
			key = append(append(append(key, kind...), '/'), k...)
			return fn(key, v)
		})
	})
}

func (t *Tx) countObjects() (int, error) {
	parent, err := t.bucket(Objects)
	if err != nil {
		return 0, err
	}
	n := 0
	err = parent.ForEachBucket(func(kind []byte) error {
		n += parent.Bucket(kind).Stats().KeyN
		return nil
	})
	return n, err
}

// ReplaceKind makes the n objects item returns (whole keys "kind/...", and
// their JSON) the stored objects of kind, atomically: they are written
// beside the kind's bucket in transactions of replaceChunk objects, then one
// transaction swaps them in and runs final (nil: nothing). On an error
// nothing changes.
func (s *Store) ReplaceKind(kind string, n int, item func(i int) (key []byte, raw json.RawMessage, err error), final func(tx *Tx) error) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket([]byte(staging)); err != nil && !errors.Is(err, berrors.ErrBucketNotFound) {
			return err
		}
		st, err := tx.CreateBucket([]byte(staging))
		if err != nil {
			return err
		}
		_, err = st.CreateBucket([]byte(kind))
		return err
	})
	if err == nil {
		for from := 0; from < n && err == nil; from += replaceChunk {
			err = s.db.Update(func(tx *bolt.Tx) error {
				b := tx.Bucket([]byte(staging)).Bucket([]byte(kind))
				for i := from; i < min(from+replaceChunk, n); i++ {
					key, raw, err := item(i)
					if err != nil {
						return err
					}
					k, sub, err := splitObjectKey(key)
					if err != nil {
						return err
					}
					if string(k) != kind {
						return fmt.Errorf("object %q in a replace of kind %s", key, kind)
					}
					if !json.Valid(raw) {
						return fmt.Errorf("object %q: not JSON", key)
					}
					if err := b.Put(sub, raw); err != nil {
						return fmt.Errorf("put %s/%s: %w", staging, key, err)
					}
				}
				return nil
			})
		}
	}
	if err == nil {
		err = s.db.Update(func(tx *bolt.Tx) error {
			objs, st := tx.Bucket([]byte(Objects)), tx.Bucket([]byte(staging))
			if err := objs.DeleteBucket([]byte(kind)); err != nil && !errors.Is(err, berrors.ErrBucketNotFound) {
				return err
			}
			if err := tx.MoveBucket([]byte(kind), st, objs); err != nil {
				return fmt.Errorf("swap in %s: %w", kind, err)
			}
			if err := tx.DeleteBucket([]byte(staging)); err != nil {
				return err
			}
			if final != nil {
				return final(&Tx{tx: tx})
			}
			return nil
		})
	}
	if err != nil {
		_ = s.db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket([]byte(staging)) })
		return fmt.Errorf("replace stored %s objects: %w", kind, err)
	}
	return nil
}

// migrateObjects moves the objects an older agent kept in one flat bucket
// ("Kind/namespace/name" keys) into their kinds' buckets, and drops what a
// replace interrupted by a crash left in staging.
func migrateObjects(tx *bolt.Tx) error {
	if err := tx.DeleteBucket([]byte(staging)); err != nil && !errors.Is(err, berrors.ErrBucketNotFound) {
		return err
	}
	parent := tx.Bucket([]byte(Objects))
	type kv struct{ k, v []byte }
	var flat []kv
	err := parent.ForEach(func(k, v []byte) error {
		if v != nil { // a value, not a kind's bucket
			flat = append(flat, kv{bytes.Clone(k), bytes.Clone(v)})
		}
		return nil
	})
	if err != nil {
		return err
	}
	t := &Tx{tx: tx}
	for _, e := range flat {
		if err := parent.Delete(e.k); err != nil {
			return err
		}
		b, sub, err := t.objectBucket(e.k, true)
		if err != nil {
			continue // not an object key: dropped
		}
		if err := b.Put(sub, e.v); err != nil {
			return err
		}
	}
	return nil
}
