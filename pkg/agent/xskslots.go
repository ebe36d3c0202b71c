package agent

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/store"
)

// slotRange is one VM's AF_XDP socket slots in the datapath's XSKMAP:
// Base..Base+Count-1, reserved for Owner (an attachment key).
type slotRange struct {
	Base  uint32 `json:"base"`
	Count int    `json:"count"`
	Owner string `json:"owner"`
}

// findSlots returns the lowest base where n consecutive slots below max are
// free of every range in used.
func findSlots(used []slotRange, n, max int) (uint32, error) {
	if n < 1 || n > max {
		return 0, fmt.Errorf("%d socket slots requested (1..%d)", n, max)
	}
	sorted := append([]slotRange(nil), used...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Base < sorted[j].Base })
	next := 0
	for _, r := range sorted {
		if int(r.Base)-next >= n {
			break
		}
		if end := int(r.Base) + r.Count; end > next {
			next = end
		}
	}
	if next+n > max {
		return 0, fmt.Errorf("no %d free socket slots among %d: %w", n, max, ErrExhausted)
	}
	return uint32(next), nil
}

func slotKey(base uint32) []byte {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], base)
	return b[:]
}

// slotRangesTx returns every reserved range.
func slotRangesTx(tx *store.Tx) ([]slotRange, error) {
	var out []slotRange
	err := tx.ForEach(store.XSKSlots, func(k []byte, raw json.RawMessage) error {
		var r slotRange
		if err := json.Unmarshal(raw, &r); err != nil {
			return fmt.Errorf("decode socket slots %x: %w", k, err)
		}
		out = append(out, r)
		return nil
	})
	return out, err
}

// allocSlotsTx reserves n consecutive socket slots for owner.
func allocSlotsTx(tx *store.Tx, owner string, n int) (uint32, error) {
	used, err := slotRangesTx(tx)
	if err != nil {
		return 0, fmt.Errorf("allocate socket slots: %w", err)
	}
	base, err := findSlots(used, n, datapath.MaxXSKs)
	if err != nil {
		return 0, fmt.Errorf("allocate socket slots: %w", err)
	}
	if err := tx.Put(store.XSKSlots, slotKey(base), slotRange{Base: base, Count: n, Owner: owner}); err != nil {
		return 0, fmt.Errorf("allocate socket slots: %w", err)
	}
	return base, nil
}

// releaseSlotsTx frees the ranges of owners for which drop returns true.
func releaseSlotsTx(tx *store.Tx, drop func(owner string) (bool, error)) (int, error) {
	used, err := slotRangesTx(tx)
	if err != nil {
		return 0, fmt.Errorf("release socket slots: %w", err)
	}
	n := 0
	for _, r := range used {
		ok, err := drop(r.Owner)
		if err != nil {
			return n, fmt.Errorf("release socket slots: %w", err)
		}
		if !ok {
			continue
		}
		if err := tx.Delete(store.XSKSlots, slotKey(r.Base)); err != nil {
			return n, fmt.Errorf("release socket slots: %w", err)
		}
		n++
	}
	return n, nil
}
