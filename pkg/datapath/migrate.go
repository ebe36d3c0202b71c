package datapath

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Upgrades and resizes never stop the agent at its pinned maps. A map pinned
// by a previous agent whose shape differs from what this one loads (an
// upgrade changed a key or value layout, or --conntrack-entries changed the
// conntrack table's size) is migrated before loading: a new map of the new
// shape is created, the old entries are copied into it when the key and
// value layouts are unchanged (a resize keeps every flow; a shrink keeps what
// fits), and the pin is swapped to it with one rename. A map whose layout
// changed, a per-CPU counter map and a map of maps start empty (its entries cannot be read as the new layout): the
// agent refills what it owns from its state; what the datapath keeps by
// itself (conntrack) starts over. The previous agent's programs keep
// forwarding with the old maps until this agent's programs replace them on
// the same links, so the datapath never stops.

// migrateResult says what migrateMap did to one map.
type migrateResult struct {
	Copied, Dropped int
	Recreated       bool // the layout changed: started empty
}

// migratePinned makes every by-name pinned map of spec that exists in dir
// with another shape fit spec (see above), logging what it did.
func migratePinned(spec *ebpf.CollectionSpec, dir string, log *slog.Logger) error {
	for name, ms := range spec.Maps {
		if ms.Pinning != ebpf.PinByName {
			continue
		}
		path := filepath.Join(dir, name)
		old, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("open pinned map %s: %w", name, err)
		}
		cerr := ms.Compatible(old)
		if cerr == nil {
			old.Close()
			continue
		}
		if !errors.Is(cerr, ebpf.ErrMapIncompatible) {
			old.Close()
			return fmt.Errorf("pinned map %s: %w", name, cerr)
		}
		res, err := migrateMap(ms, old, path)
		old.Close()
		if err != nil {
			return fmt.Errorf("migrate pinned map %s (%v): %w", name, cerr, err)
		}
		log.Warn("pinned map migrated to a new shape", "map", name, "change", cerr.Error(),
			"copied", res.Copied, "dropped", res.Dropped, "started_empty", res.Recreated)
	}
	return nil
}

// migrateMap creates ms's map, fills it from old where the layouts allow and
// pins it at path in old's place.
func migrateMap(ms *ebpf.MapSpec, old *ebpf.Map, path string) (migrateResult, error) {
	var res migrateResult
	ns := ms.Copy()
	ns.Pinning = ebpf.PinNone
	nm, err := ebpf.NewMap(ns)
	if err != nil {
		return res, fmt.Errorf("create: %w", err)
	}
	defer nm.Close()
	same := old.Type() == nm.Type() && old.KeySize() == nm.KeySize() && old.ValueSize() == nm.ValueSize()
	if !same || isMapOfMaps(nm.Type()) || isPerCPU(nm.Type()) {
		// Per-CPU maps are counters: they start over with the new shape.
		res.Recreated = true
	} else {
		res.Copied, res.Dropped, err = copyEntries(old, nm)
	}
	if err != nil {
		return res, err
	}
	tmp := path + "_migrating" // bpffs refuses names with a dot
	os.Remove(tmp)
	if err := nm.Pin(tmp); err != nil {
		return res, fmt.Errorf("pin: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return res, fmt.Errorf("swap pin: %w", err)
	}
	return res, nil
}

// copyEntries copies old's entries into nm (same key and value layout);
// entries that do not fit (a smaller map) are counted as dropped.
func copyEntries(old, nm *ebpf.Map) (copied, dropped int, err error) {
	var key, val []byte
	it := old.Iterate()
	for it.Next(&key, &val) {
		if err := nm.Update(key, val, ebpf.UpdateAny); err != nil {
			if isNoSpace(err) {
				dropped++
				continue
			}
			return copied, dropped, fmt.Errorf("copy entry: %w", err)
		}
		copied++
	}
	if err := it.Err(); err != nil {
		return copied, dropped, fmt.Errorf("read old entries: %w", err)
	}
	return copied, dropped, nil
}

func isMapOfMaps(t ebpf.MapType) bool { return t == ebpf.ArrayOfMaps || t == ebpf.HashOfMaps }

func isPerCPU(t ebpf.MapType) bool {
	return t == ebpf.PerCPUArray || t == ebpf.PerCPUHash || t == ebpf.LRUCPUHash
}

// isNoSpace reports a map without room (E2BIG from an array, ENOSPC from a
// full hash).
func isNoSpace(err error) bool {
	return errors.Is(err, unix.E2BIG) || errors.Is(err, unix.ENOSPC)
}
