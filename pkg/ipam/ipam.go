// Package ipam hands out addresses from the node's pod CIDRs, one allocator
// per address family (IPv4 and IPv6 keep separate ranges, cursors and
// records; one owner may hold one address of each). Allocations
// are keyed by owner (container ID + ifname), persisted in the store and
// survive restarts. Like the host-local plugin, the search for a free address
// starts after the last one handed out (wrapping at the end of the range), so
// an address just freed is not reused at once; that cursor is persisted too.
package ipam

import (
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

// IPAM allocates from one prefix, IPv4 or IPv6. Both families share the
// store's IPAM bucket: an address's key is its 4 or 16 bytes.
type IPAM struct {
	st     *store.Store
	prefix netip.Prefix
}

// Meta keys per family: IPv4 keeps the names it always had.
func (a *IPAM) metaCIDRKey() []byte { return cidrKey(a.is6()) }

func cidrKey(ipv6 bool) []byte {
	if ipv6 {
		return []byte("pod-cidr6")
	}
	return []byte("pod-cidr")
}

// RecordedPrefix reads, in tx, the prefix the address pool of one family
// recorded (as its String); found is false when that pool never ran.
func RecordedPrefix(tx *store.Tx, ipv6 bool) (prefix string, found bool, err error) {
	found, err = tx.Get(store.Meta, cidrKey(ipv6), &prefix)
	return prefix, found, err
}

func (a *IPAM) metaLastKey() []byte {
	if a.is6() {
		return []byte("ipam-last-reserved6")
	}
	return []byte("ipam-last-reserved")
}

func (a *IPAM) is6() bool { return a.prefix.Addr().Is6() }

// New returns an allocator for prefix (IPv4 /30 or larger, IPv6 /126 or
// larger). It refuses a prefix that differs from the one recorded in st for
// its family while that family has allocations.
func New(st *store.Store, prefix netip.Prefix) (*IPAM, error) {
	if !prefix.IsValid() {
		return nil, errors.New("open ipam: invalid pod CIDR")
	}
	prefix = prefix.Masked()
	if prefix.Addr().Is4In6() {
		return nil, fmt.Errorf("pod CIDR %s: an IPv4-mapped IPv6 prefix; give IPv4 as IPv4", prefix)
	}
	if prefix.Addr().Zone() != "" {
		return nil, fmt.Errorf("pod CIDR %s: has a zone", prefix)
	}
	if prefix.Addr().Is4() && prefix.Bits() > 30 {
		return nil, fmt.Errorf("pod CIDR %s: need /30 or larger", prefix)
	}
	if prefix.Addr().Is6() && prefix.Bits() > 126 {
		return nil, fmt.Errorf("pod CIDR %s: need /126 or larger", prefix)
	}
	a := &IPAM{st: st, prefix: prefix}
	err := st.Update(func(tx *store.Tx) error {
		var old string
		ok, err := tx.Get(store.Meta, a.metaCIDRKey(), &old)
		if err != nil {
			return err
		}
		if ok && old != prefix.String() {
			n := 0
			err := tx.ForEach(store.IPAM, func(k []byte, _ json.RawMessage) error {
				if len(k) == a.prefix.Addr().BitLen()/8 {
					n++
				}
				return nil
			})
			if err != nil {
				return err
			}
			if n > 0 {
				return fmt.Errorf("stored %s has %d allocations, asked for %s: %w", old, n, prefix, ErrCIDRChanged)
			}
		}
		return tx.Put(store.Meta, a.metaCIDRKey(), prefix.String())
	})
	if err != nil {
		return nil, fmt.Errorf("open ipam: %w", err)
	}
	return a, nil
}

// Prefix returns the pool's prefix.
func (a *IPAM) Prefix() netip.Prefix { return a.prefix }

// Capacity is the number of usable addresses: IPv4 without the network and
// broadcast addresses, IPv6 without the subnet-router anycast address (the
// prefix itself); capped at the largest int.
func (a *IPAM) Capacity() int {
	host := a.prefix.Addr().BitLen() - a.prefix.Bits()
	if host >= 62 {
		return int(^uint(0) >> 1)
	}
	if a.is6() {
		return 1<<host - 1
	}
	return 1<<host - 2
}

func key(ip netip.Addr) []byte { return ip.AsSlice() }

// bounds returns the first and last usable addresses.
func (a *IPAM) bounds() (netip.Addr, netip.Addr) {
	first := a.prefix.Addr().Next()
	last := a.prefix.Addr()
	b := last.AsSlice()
	host := len(b)*8 - a.prefix.Bits()
	for i := len(b) - 1; i >= 0 && host > 0; i-- {
		n := min(host, 8)
		b[i] |= byte(1<<n - 1)
		host -= n
	}
	last, _ = netip.AddrFromSlice(b)
	if !a.is6() {
		last = last.Prev() // broadcast
	}
	return first, last
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
	used := map[netip.Addr]bool{}
	width := a.prefix.Addr().BitLen() / 8
	err := tx.ForEach(store.IPAM, func(k []byte, _ json.RawMessage) error {
		if len(k) == width {
			ip, _ := netip.AddrFromSlice(k)
			used[ip] = true
		}
		return nil
	})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("allocate ip for %s: %w", owner, err)
	}
	start := lo
	var last string
	if ok, err := tx.Get(store.Meta, a.metaLastKey(), &last); err != nil {
		return netip.Addr{}, fmt.Errorf("allocate ip for %s: %w", owner, err)
	} else if ok {
		if ip, err := netip.ParseAddr(last); err == nil && a.prefix.Contains(ip) && ip.Compare(lo) >= 0 && ip.Less(hi) {
			start = ip.Next()
		}
	}
	// Walk start..hi, then wrap to lo..start-1. At most len(used) addresses
	// are taken, so len(used)+1 steps find a free one if the range has one.
	ip := start
	for i := 0; i <= len(used) && i < a.Capacity(); i++ {
		if !used[ip] {
			if err := tx.Put(store.IPAM, key(ip), Allocation{IP: ip, Owner: owner}); err != nil {
				return netip.Addr{}, fmt.Errorf("allocate ip for %s: %w", owner, err)
			}
			if err := tx.Put(store.Meta, a.metaLastKey(), ip.String()); err != nil {
				return netip.Addr{}, fmt.Errorf("allocate ip for %s: %w", owner, err)
			}
			return ip, nil
		}
		if ip == hi {
			ip = lo
		} else {
			ip = ip.Next()
		}
	}
	return netip.Addr{}, fmt.Errorf("allocate ip for %s in %s: %w", owner, a.prefix, ErrExhausted)
}

// Lookup returns owner's address of this allocator's family if it has one.
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
		if al.Owner == owner && al.IP.Is4() == !a.is6() {
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

// Allocations lists every allocation of this allocator's family in address
// order.
func (a *IPAM) Allocations() ([]Allocation, error) {
	var out []Allocation
	err := a.st.View(func(tx *store.Tx) error {
		var err error
		out, err = a.AllocationsTx(tx)
		return err
	})
	return out, err
}

// AllocationsTx is Allocations inside the caller's transaction.
func (a *IPAM) AllocationsTx(tx *store.Tx) ([]Allocation, error) {
	var out []Allocation
	err := tx.ForEach(store.IPAM, func(k []byte, raw json.RawMessage) error {
		var al Allocation
		if err := json.Unmarshal(raw, &al); err != nil {
			return fmt.Errorf("decode allocation %x: %w", k, err)
		}
		if al.IP.Is4() == !a.is6() {
			out = append(out, al)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list allocations: %w", err)
	}
	return out, nil
}

// ErrTaken means the address is held by another owner.
var ErrTaken = errors.New("address held by another owner")

// HolderTx returns who holds ip, if anyone.
func (a *IPAM) HolderTx(tx *store.Tx, ip netip.Addr) (string, bool, error) {
	var al Allocation
	ok, err := tx.Get(store.IPAM, key(ip), &al)
	if err != nil || !ok {
		return "", false, err
	}
	return al.Owner, true, nil
}

// ClaimTx records ip for owner: a live-migrated VM keeps its address, which
// may lie outside this allocator's prefix (Allocate never walks there, so
// such a claim only stops a second claim of the same address). A holder
// for which takeOver returns true gives the address up to owner; any other
// is ErrTaken. Claiming an address owner already holds is a no-op.
func (a *IPAM) ClaimTx(tx *store.Tx, owner string, ip netip.Addr, takeOver func(holder string) bool) error {
	if owner == "" {
		return errors.New("claim ip: empty owner")
	}
	if !ip.IsValid() || ip.Is4() == a.is6() {
		return fmt.Errorf("claim ip %s for %s: not an address of this family", ip, owner)
	}
	if err := a.claimable(ip); err != nil {
		return fmt.Errorf("claim ip %s for %s: %w", ip, owner, err)
	}
	if cur, ok, err := a.lookupTx(tx, owner); err != nil {
		return err
	} else if ok && cur != ip {
		return fmt.Errorf("claim ip %s for %s: it holds %s: %w", ip, owner, cur, ErrTaken)
	}
	holder, held, err := a.HolderTx(tx, ip)
	if err != nil {
		return fmt.Errorf("claim ip %s for %s: %w", ip, owner, err)
	}
	if held && holder != owner && (takeOver == nil || !takeOver(holder)) {
		return fmt.Errorf("claim ip %s for %s: held by %s: %w", ip, owner, holder, ErrTaken)
	}
	if err := tx.Put(store.IPAM, key(ip), Allocation{IP: ip, Owner: owner}); err != nil {
		return fmt.Errorf("claim ip %s for %s: %w", ip, owner, err)
	}
	return nil
}

// ErrReserved means the address can be no endpoint's.
var ErrReserved = errors.New("reserved address")

// claimable refuses what no endpoint may hold: an unspecified, loopback,
// multicast or link-local address (the pods' gateway is link-local), and in
// this allocator's prefix the addresses Allocate never hands out (the
// network address, IPv4's broadcast, IPv6's subnet-router anycast).
func (a *IPAM) claimable(ip netip.Addr) error {
	if ip.IsUnspecified() || ip.IsLoopback() || ip.IsMulticast() || ip.IsLinkLocalUnicast() || ip.Is4In6() {
		return fmt.Errorf("%w: not an endpoint address", ErrReserved)
	}
	if a.prefix.Contains(ip) {
		if first, last := a.bounds(); ip.Less(first) || last.Less(ip) {
			return fmt.Errorf("%w: outside %s's usable range %s-%s", ErrReserved, a.prefix, first, last)
		}
	}
	return nil
}

// Contains reports whether ip is in this allocator's prefix.
func (a *IPAM) Contains(ip netip.Addr) bool { return a.prefix.Contains(ip) }
