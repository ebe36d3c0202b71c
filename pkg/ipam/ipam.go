// Package ipam hands out IPv4 addresses from the node's pod CIDR. Allocations
// are keyed by owner (container ID + ifname), persisted in the store and
// survive restarts. Like the host-local plugin, the search for a free address
// starts after the last one handed out (wrapping at the end of the range), so
// an address just freed is not reused at once; that cursor is persisted too.
package ipam

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"

	"github.com/lanekit/lanekit/pkg/store"
)

// ErrExhausted means every usable address in the CIDR is allocated.
var ErrExhausted = errors.New("pod CIDR exhausted")

// ErrCIDRChanged means the store holds allocations from a different CIDR.
var ErrCIDRChanged = errors.New("pod CIDR differs from the stored one")

// Allocation is one address and who holds it.
type Allocation struct {
	IP    netip.Addr `json:"ip"`
	Owner string     `json:"owner"`
}

// IPAM allocates from one IPv4 prefix.
type IPAM struct {
	st     *store.Store
	prefix netip.Prefix
}

var (
	metaCIDRKey = []byte("pod-cidr")
	metaLastKey = []byte("ipam-last-reserved")
)

// New returns an allocator for prefix (IPv4, /30 or larger). It refuses a
// prefix that differs from the one recorded in st while allocations exist.
func New(st *store.Store, prefix netip.Prefix) (*IPAM, error) {
	prefix = prefix.Masked()
	if !prefix.Addr().Is4() {
		return nil, fmt.Errorf("pod CIDR %s: only IPv4 is supported", prefix)
	}
	if prefix.Bits() > 30 {
		return nil, fmt.Errorf("pod CIDR %s: need /30 or larger", prefix)
	}
	err := st.Update(func(tx *store.Tx) error {
		var old string
		ok, err := tx.Get(store.Meta, metaCIDRKey, &old)
		if err != nil {
			return err
		}
		if ok && old != prefix.String() {
			n, err := tx.Count(store.IPAM)
			if err != nil {
				return err
			}
			if n > 0 {
				return fmt.Errorf("stored %s has %d allocations, asked for %s: %w", old, n, prefix, ErrCIDRChanged)
			}
		}
		return tx.Put(store.Meta, metaCIDRKey, prefix.String())
	})
	if err != nil {
		return nil, fmt.Errorf("open ipam: %w", err)
	}
	return &IPAM{st: st, prefix: prefix}, nil
}

// Prefix returns the pool's prefix.
func (a *IPAM) Prefix() netip.Prefix { return a.prefix }

// Capacity is the number of usable addresses (network and broadcast excluded).
func (a *IPAM) Capacity() int {
	return 1<<(32-a.prefix.Bits()) - 2
}

func key(ip netip.Addr) []byte {
	b := ip.As4()
	return b[:]
}

func u32(ip netip.Addr) uint32 { return binary.BigEndian.Uint32(key(ip)) }

func addr(v uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// first and last usable addresses as integers.
func (a *IPAM) bounds() (uint32, uint32) {
	net := u32(a.prefix.Addr())
	size := uint32(1) << (32 - a.prefix.Bits())
	return net + 1, net + size - 2
}

// Allocate returns owner's address, allocating the first free one after the
// last address handed out if owner has none. Calling it again for the same
// owner returns the same address.
func (a *IPAM) Allocate(owner string) (netip.Addr, error) {
	var got netip.Addr
	err := a.st.Update(func(tx *store.Tx) error {
		var err error
		got, err = a.AllocateTx(tx, owner)
		return err
	})
	return got, err
}

// AllocateTx is Allocate inside the caller's transaction.
func (a *IPAM) AllocateTx(tx *store.Tx, owner string) (netip.Addr, error) {
	if owner == "" {
		return netip.Addr{}, errors.New("allocate ip: empty owner")
	}
	if ip, ok, err := a.lookupTx(tx, owner); err != nil || ok {
		return ip, err
	}
	lo, hi := a.bounds()
	used := map[uint32]bool{}
	err := tx.ForEach(store.IPAM, func(k []byte, _ json.RawMessage) error {
		if len(k) == 4 {
			used[binary.BigEndian.Uint32(k)] = true
		}
		return nil
	})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("allocate ip for %s: %w", owner, err)
	}
	start := lo
	var last string
	if ok, err := tx.Get(store.Meta, metaLastKey, &last); err != nil {
		return netip.Addr{}, fmt.Errorf("allocate ip for %s: %w", owner, err)
	} else if ok {
		if ip, err := netip.ParseAddr(last); err == nil && a.prefix.Contains(ip) && u32(ip) >= lo && u32(ip) < hi {
			start = u32(ip) + 1
		}
	}
	// Walk start..hi, then wrap to lo..start-1.
	n := hi - lo + 1
	for i := uint32(0); i < n; i++ {
		v := lo + (start-lo+i)%n
		if used[v] {
			continue
		}
		ip := addr(v)
		if err := tx.Put(store.IPAM, key(ip), Allocation{IP: ip, Owner: owner}); err != nil {
			return netip.Addr{}, fmt.Errorf("allocate ip for %s: %w", owner, err)
		}
		if err := tx.Put(store.Meta, metaLastKey, ip.String()); err != nil {
			return netip.Addr{}, fmt.Errorf("allocate ip for %s: %w", owner, err)
		}
		return ip, nil
	}
	return netip.Addr{}, fmt.Errorf("allocate ip for %s in %s: %w", owner, a.prefix, ErrExhausted)
}

// Lookup returns owner's address if it has one.
func (a *IPAM) Lookup(owner string) (netip.Addr, bool, error) {
	var ip netip.Addr
	var ok bool
	err := a.st.View(func(tx *store.Tx) error {
		var err error
		ip, ok, err = a.lookupTx(tx, owner)
		return err
	})
	return ip, ok, err
}

func (a *IPAM) lookupTx(tx *store.Tx, owner string) (netip.Addr, bool, error) {
	var ip netip.Addr
	found := errors.New("found")
	err := tx.ForEach(store.IPAM, func(k []byte, raw json.RawMessage) error {
		var al Allocation
		if err := json.Unmarshal(raw, &al); err != nil {
			return fmt.Errorf("decode allocation %x: %w", k, err)
		}
		if al.Owner == owner {
			ip = al.IP
			return found
		}
		return nil
	})
	if errors.Is(err, found) {
		return ip, true, nil
	}
	if err != nil {
		return netip.Addr{}, false, fmt.Errorf("look up ip of %s: %w", owner, err)
	}
	return netip.Addr{}, false, nil
}

// Release frees owner's address. Releasing an owner with no address is not
// an error.
func (a *IPAM) Release(owner string) error {
	return a.st.Update(func(tx *store.Tx) error { return a.ReleaseTx(tx, owner) })
}

// ReleaseTx is Release inside the caller's transaction.
func (a *IPAM) ReleaseTx(tx *store.Tx, owner string) error {
	ip, ok, err := a.lookupTx(tx, owner)
	if err != nil || !ok {
		return err
	}
	if err := tx.Delete(store.IPAM, key(ip)); err != nil {
		return fmt.Errorf("release %s of %s: %w", ip, owner, err)
	}
	return nil
}

// Allocations lists every allocation in address order.
func (a *IPAM) Allocations() ([]Allocation, error) {
	var out []Allocation
	err := a.st.View(func(tx *store.Tx) error {
		return tx.ForEach(store.IPAM, func(k []byte, raw json.RawMessage) error {
			var al Allocation
			if err := json.Unmarshal(raw, &al); err != nil {
				return fmt.Errorf("decode allocation %x: %w", k, err)
			}
			out = append(out, al)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list allocations: %w", err)
	}
	return out, nil
}
