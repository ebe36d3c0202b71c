package datapath

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

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
// itself (conntrack) starts over. So do maps of file descriptors (program
// arrays, lk_xsks, device and socket maps): what the kernel returns for an
// entry is an id or nothing (an XSKMAP answers EOPNOTSUPP), never an fd that
// could be written back. The loader re-installs the tail-call programs after
// loading; lk_xsks is refilled when each VM's backend fetches its sockets
// again (the agent restarts adopted backends when it was recreated). The previous agent's programs keep
// forwarding with the old maps until this agent's programs replace them on
// the same links, so the datapath never stops.

// migrateResult says what migrateMap did to one map.
type migrateResult struct {
	Copied, Dropped int
	Recreated       bool // the layout changed, or it holds fds: started empty
}

// migratePinned makes every by-name pinned map of spec that exists in dir
// with another shape fit spec (see above), logging what it did. It returns
// the names of the maps it replaced with empty ones.
func migratePinned(spec *ebpf.CollectionSpec, dir string, log *slog.Logger) (emptied []string, err error) {
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
			return emptied, fmt.Errorf("open pinned map %s: %w", name, err)
		}
		cerr := ms.Compatible(old)
		if cerr == nil {
			old.Close()
			continue
		}
		if !errors.Is(cerr, ebpf.ErrMapIncompatible) {
			old.Close()
			return emptied, fmt.Errorf("pinned map %s: %w", name, cerr)
		}
		res, err := migrateMap(ms, old, path)
		old.Close()
		if err != nil {
			return emptied, fmt.Errorf("migrate pinned map %s (%v): %w", name, cerr, err)
		}
		if res.Recreated {
			emptied = append(emptied, name)
		}
		log.Warn("pinned map migrated to a new shape", "map", name, "change", cerr.Error(),
			"copied", res.Copied, "dropped", res.Dropped, "started_empty", res.Recreated)
	}
	return emptied, nil
}

// migrate is migratePinned in the loader's pin directory; it remembers the
// maps it emptied (EmptiedMaps).
func (l *Loader) migrate(spec *ebpf.CollectionSpec) error {
	sizeMaps(spec, l.cfg)
	emptied, err := migratePinned(spec, l.cfg.PinDir, l.log)
	l.emptied = append(l.emptied, emptied...)
	return err
}

// EmptiedMaps names the pinned maps this loader replaced with empty maps of
// a new shape when it opened: their old entries are gone, and the agent
// must refill what it owns there (lk_xsks: the VMs' AF_XDP sockets).
func (l *Loader) EmptiedMaps() []string { return slices.Clone(l.emptied) }

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
	if !same || holdsFDs(nm.Type()) || isPerCPU(nm.Type()) {
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

// holdsFDs reports a map whose values are file descriptors when written
// (programs, maps, sockets, devices, perf events, cgroups): reading one back
// gives an id or fails, so its entries cannot be copied.
func holdsFDs(t ebpf.MapType) bool {
	switch t {
	case ebpf.ArrayOfMaps, ebpf.HashOfMaps, ebpf.ProgramArray, ebpf.XSKMap, ebpf.DevMap, ebpf.DevMapHash,
		ebpf.CPUMap, ebpf.SockMap, ebpf.SockHash, ebpf.PerfEventArray, ebpf.CGroupArray, ebpf.ReusePortSockArray:
		return true
	}
	return false
}

func isPerCPU(t ebpf.MapType) bool {
	return t == ebpf.PerCPUArray || t == ebpf.PerCPUHash || t == ebpf.LRUCPUHash
}

// isNoSpace reports a map without room (E2BIG from an array, ENOSPC from a
// full hash).
func isNoSpace(err error) bool {
	return errors.Is(err, unix.E2BIG) || errors.Is(err, unix.ENOSPC)
}
