// Package store is the agent's persistent state: one bbolt file under the
// state directory, JSON values, one bucket per concern.
package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// Bucket names one kind of record.
type Bucket string

const (
	Endpoints   Bucket = "endpoints"    // attachment key -> endpoint.Endpoint
	EndpointIDs Bucket = "endpoint-ids" // big-endian uint32 ID -> attachment key
	IPAM        Bucket = "ipam"         // 4-byte IPv4 address -> ipam.Allocation
	Meta        Bucket = "meta"         // settings that must not change under existing state
	XSKSlots    Bucket = "xsk-slots"    // big-endian uint32 first slot -> a VM's AF_XDP socket slot range
	Objects     Bucket = "objects"      // "Kind/namespace/name" -> the Kubernetes object (JSON with apiVersion/kind)
	Identities  Bucket = "identities"   // big-endian uint32 policy identity -> what it was allocated for
)

var buckets = []Bucket{Endpoints, EndpointIDs, IPAM, Meta, XSKSlots, Objects, Identities}

// FileName is the database file inside the state directory.
const FileName = "lanekit.db"

// Store is an open state database.
type Store struct {
	db *bolt.DB
}

// initialMmapSize is the address space the database is mapped with from the
// start (pages are read in only as they are used: not memory). Each time a
// write outgrows the mapping, bbolt copies every key and value the
// transaction touched to the heap before remapping: the agent's first full
// set of EndpointSlices, tens of megabytes of JSON in one transaction, was
// copied once per doubling of the file.
const initialMmapSize = 1 << 30

// Open opens (creating if needed) the database in dir. It fails after a
// second if another process holds the database.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, FileName)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, InitialMmapSize: initialMmapSize})
	if err != nil {
		return nil, fmt.Errorf("open state db %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range buckets {
			if _, err := tx.CreateBucketIfNotExists([]byte(b)); err != nil {
				return fmt.Errorf("create bucket %s: %w", b, err)
			}
		}
		return migrateObjects(tx) // objects.go
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init state db %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// DropMappedPages takes the database's pages out of the process's resident
// set: bbolt reads through a shared, read-only mapping of the file, so a
// restore that reads every stored object leaves the whole file mapped in
// (file-backed RSS) until the process exits. MADV_DONTNEED unmaps them from
// this process only: they stay in the page cache, the file is unchanged
// (bbolt writes with pwrite, never through the mapping), and a later read
// maps a page in again. The read transaction holds bbolt's mmap lock, so
// the mapping cannot be replaced meanwhile.
func (s *Store) DropMappedPages() error {
	return s.db.View(func(tx *bolt.Tx) error {
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, s.db.Info().Data, uintptr(tx.Size()), unix.MADV_DONTNEED); e != 0 {
			return fmt.Errorf("madvise the state db's mapping: %w", e)
		}
		return nil
	})
}

// Update runs fn in a read-write transaction; fn's error rolls it back.
func (s *Store) Update(fn func(tx *Tx) error) error {
	return s.db.Update(func(btx *bolt.Tx) error { return fn(&Tx{tx: btx}) })
}

// View runs fn in a read-only transaction.
func (s *Store) View(fn func(tx *Tx) error) error {
	return s.db.View(func(btx *bolt.Tx) error { return fn(&Tx{tx: btx}) })
}

// Tx is a transaction over the store's buckets.
type Tx struct {
	tx *bolt.Tx
}

// ErrNoBucket means a bucket name is not one of the store's buckets.
var ErrNoBucket = errors.New("no such bucket")

func (t *Tx) bucket(b Bucket) (*bolt.Bucket, error) {
	bk := t.tx.Bucket([]byte(b))
	if bk == nil {
		return nil, fmt.Errorf("bucket %s: %w", b, ErrNoBucket)
	}
	return bk, nil
}

// place is where key lives: its bucket and its key there. An Objects key
// lives in its kind's bucket (objects.go); create makes a missing kind's
// bucket, which is nil otherwise (the key is absent).
func (t *Tx) place(b Bucket, key []byte, create bool) (*bolt.Bucket, []byte, error) {
	if b == Objects {
		return t.objectBucket(key, create)
	}
	bk, err := t.bucket(b)
	return bk, key, err
}

// get returns the value at key (nil: absent).
func (t *Tx) get(b Bucket, key []byte) ([]byte, error) {
	bk, k, err := t.place(b, key, false)
	if err != nil || bk == nil {
		return nil, err
	}
	return bk.Get(k), nil
}

// Get decodes the value at key into v. It reports false if key is absent.
func (t *Tx) Get(b Bucket, key []byte, v any) (bool, error) {
	raw, err := t.get(b, key)
	if err != nil {
		return false, err
	}
	if raw == nil {
		return false, nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return true, fmt.Errorf("decode %s/%x: %w", b, key, err)
	}
	return true, nil
}

// Has reports whether key is present.
func (t *Tx) Has(b Bucket, key []byte) (bool, error) {
	raw, err := t.get(b, key)
	return raw != nil, err
}

// Put stores v as JSON at key.
func (t *Tx) Put(b Bucket, key []byte, v any) error {
	bk, k, err := t.place(b, key, true)
	if err != nil {
		return err
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s/%x: %w", b, key, err)
	}
	if err := bk.Put(k, raw); err != nil {
		return fmt.Errorf("put %s/%x: %w", b, key, err)
	}
	return nil
}

// PutRawIfChanged stores raw (one JSON value) at key unless key holds those
// bytes already: a rewrite of an unchanged value still costs the
// transaction its node and page (the agent's full sets after a restart are
// mostly the objects it stored).
func (t *Tx) PutRawIfChanged(b Bucket, key []byte, raw json.RawMessage) error {
	old, err := t.get(b, key)
	if err != nil {
		return err
	}
	if old != nil && bytes.Equal(old, raw) {
		return nil
	}
	return t.Put(b, key, raw)
}

// Delete removes key; removing an absent key is not an error.
func (t *Tx) Delete(b Bucket, key []byte) error {
	bk, k, err := t.place(b, key, false)
	if err != nil || bk == nil {
		return err
	}
	if err := bk.Delete(k); err != nil {
		return fmt.Errorf("delete %s/%x: %w", b, key, err)
	}
	return nil
}

// ForEach calls fn for each key in byte order with its raw JSON value.
// fn must not modify the bucket.
func (t *Tx) ForEach(b Bucket, fn func(key []byte, raw json.RawMessage) error) error {
	if b == Objects {
		return t.forEachObject(fn)
	}
	bk, err := t.bucket(b)
	if err != nil {
		return err
	}
	return bk.ForEach(func(k, v []byte) error { return fn(k, v) })
}

// Count returns the number of keys in b.
func (t *Tx) Count(b Bucket) (int, error) {
	if b == Objects {
		return t.countObjects()
	}
	bk, err := t.bucket(b)
	if err != nil {
		return 0, err
	}
	return bk.Stats().KeyN, nil
}
