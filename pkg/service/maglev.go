package service

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"slices"
)

// MaglevFloor is the smallest Maglev table size. Tables are sized per frontend
// from its backend count n as the smallest prime ≥ max(MaglevFloor,
// MaglevPerBackend × n'), where n' is n rounded up to a power of two:
//   - ≥ 100 slots per backend keeps each backend's share within 1 % of 1/n
//     (Maglev gives each backend ⌊M/n⌋ or ⌈M/n⌉ slots);
//   - rounding n up to a power of two keeps the size — and so the minimal
//     disruption of Maglev — across most backend additions and removals: the
//     table is rebuilt at another size only when n crosses a power of two
//     (established flows keep their backend through conntrack even then);
//   - the size is a pure function of n, so every node builds the same table;
//   - the floor keeps 1-2 backend services off a tiny table for 1 KiB each
//     (251 × 4-byte backend IDs).
const (
	MaglevFloor      = 251
	MaglevPerBackend = 100
)

// MaglevSize returns the table size for n backends (see MaglevFloor).
func MaglevSize(n int) int {
	p := 1
	for p < n {
		p <<= 1
	}
	m := max(MaglevFloor, MaglevPerBackend*p)
	for !isPrime(m) {
		m++
	}
	return m
}

func isPrime(n int) bool {
	if n < 2 {
		return false
	}
	if n%2 == 0 {
		return n == 2
	}
	for d := 3; d*d <= n; d += 2 {
		if n%d == 0 {
			return false
		}
	}
	return true
}

// maglevHashes returns the two independent hashes of a backend key the Maglev
// paper uses for offset and skip: the first and second 64-bit words of its
// SHA-256 digest. SHA-256 makes the result identical on every node and in every
// process (no per-process seed, unlike hash/maphash).
func maglevHashes(key string) (uint64, uint64) {
	sum := sha256.Sum256([]byte(key))
	return binary.BigEndian.Uint64(sum[0:8]), binary.BigEndian.Uint64(sum[8:16])
}

// Maglev fills a lookup table of size m (m prime) over the backends named by
// keys, as in Eisenbud et al., "Maglev: A Fast and Reliable Software Network
// Load Balancer" (NSDI '16), §3.4: backend i prefers slots
// (offset_i + j·skip_i) mod m for j = 0, 1, …, with offset = h1(key) mod m and
// skip = h2(key) mod (m−1) + 1; backends take turns claiming their next
// preferred free slot until the table is full. Each backend ends with ⌊m/n⌋ or
// ⌈m/n⌉ slots. The result holds indexes into keys; it depends only on keys'
// contents and order, so callers pass keys sorted to be order-independent.
// It returns nil when keys is empty.
func Maglev(keys []string, m int) []int32 {
	n := len(keys)
	if n == 0 || m <= 0 {
		return nil
	}
	// pos[i] is backend i's current preference (offset + next·skip) mod m,
	// advanced by adding skip — the same sequence without a division per step.
	mm := uint32(m)
	pos := make([]uint32, n)
	skip := make([]uint32, n)
	for i, k := range keys {
		h1, h2 := maglevHashes(k)
		pos[i] = uint32(h1 % uint64(m))
		if m > 1 {
			skip[i] = uint32(h2%uint64(m-1) + 1)
		} else {
			skip[i] = 1
		}
	}
	table := make([]int32, m)
	for i := range table {
		table[i] = -1
	}
	filled := 0
	for {
		for i := 0; i < n; i++ {
			c := pos[i]
			for table[c] >= 0 {
				if c += skip[i]; c >= mm {
					c -= mm
				}
			}
			table[c] = int32(i)
			if c += skip[i]; c >= mm {
				c -= mm
			}
			pos[i] = c
			filled++
			if filled == m {
				return table
			}
		}
	}
}

// MaglevTable is a frontend's Maglev table: per slot, the index of a backend
// in its Backends, packed — a byte per slot for up to 256 backends (4 bytes
// per slot otherwise). The zero value is no table. Immutable once built: the
// model's frontends and the programmed tables share it.
type MaglevTable struct {
	small []uint8
	big   []int32
}

// packMaglev packs a table of indexes into backends backends (nil: none).
func packMaglev(idx []int32, backends int) MaglevTable {
	switch {
	case idx == nil:
		return MaglevTable{}
	case backends <= 256:
		small := make([]uint8, len(idx))
		for i, bi := range idx {
			small[i] = uint8(bi)
		}
		return MaglevTable{small: small}
	}
	return MaglevTable{big: slices.Clone(idx)}
}

// None says there is no table (no backend takes new flows).
func (m MaglevTable) None() bool { return m.small == nil && m.big == nil }

// Len is the number of slots.
func (m MaglevTable) Len() int { return len(m.small) + len(m.big) }

// At is the backend index in slot i.
func (m MaglevTable) At(i int) int32 {
	if m.small != nil {
		return int32(m.small[i])
	}
	return m.big[i]
}

// Slots returns the table unpacked (nil: none).
func (m MaglevTable) Slots() []int32 {
	if m.None() {
		return nil
	}
	out := make([]int32, m.Len())
	for i := range out {
		out[i] = m.At(i)
	}
	return out
}

// Equal says whether m and o hold the same slots.
func (m MaglevTable) Equal(o MaglevTable) bool {
	if m.None() != o.None() || m.Len() != o.Len() {
		return false
	}
	if m.small != nil && o.small != nil {
		return bytes.Equal(m.small, o.small)
	}
	for i := range m.Len() {
		if m.At(i) != o.At(i) {
			return false
		}
	}
	return true
}
