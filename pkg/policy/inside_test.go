package policy

import (
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

// TestInsideMatchesEveryPrefixScan: the known prefixes inside an ipBlock,
// found by binary search over the sorted prefixes, are exactly those a scan
// of every prefix finds (within), for random prefixes of both families
// clustered so that nesting, equal addresses of different lengths and
// runs across family boundaries all occur.
func TestInsideMatchesEveryPrefixScan(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	random := func() netip.Prefix {
		if r.IntN(4) == 0 {
			a := [16]byte{0xfd, 0, byte(r.IntN(3)), byte(r.IntN(3))}
			a[15] = byte(r.IntN(8))
			return netip.PrefixFrom(netip.AddrFrom16(a), r.IntN(129)).Masked()
		}
		a := [4]byte{10, byte(r.IntN(3)), byte(r.IntN(3)), byte(r.IntN(8))}
		return netip.PrefixFrom(netip.AddrFrom4(a), r.IntN(33)).Masked()
	}
	for round := range 200 {
		known := map[netip.Prefix]Identity{}
		for i := range r.IntN(60) {
			known[random()] = Identity(i)
		}
		known[netip.MustParsePrefix("0.0.0.0/0")] = IdentityWorld
		known[netip.MustParsePrefix("::/0")] = IdentityWorld6
		cp := compiler{c: &Compiled{CIDRs: known}, cidrs: slices.SortedFunc(maps.Keys(known), netip.Prefix.Compare)}
		for range 20 {
			cidr := random()
			var want []netip.Prefix
			for p := range known {
				if within(p, cidr) {
					want = append(want, p)
				}
			}
			got := cp.inside(cidr)
			slices.SortFunc(want, netip.Prefix.Compare)
			slices.SortFunc(got, netip.Prefix.Compare)
			if !slices.Equal(got, want) {
				t.Fatalf("round %d: inside(%s) = %v, want %v (known %v)", round, cidr, got, want, cp.cidrs)
			}
		}
	}
}
