package ipam

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/lanekit/lanekit/pkg/store"
)

// TestClaim: a migrated VM claims the address it had on the source, inside
// this node's prefix or outside it; Allocate never hands a claimed address
// out; a holder gives it up only when takeOver agrees; Release frees it.
func TestClaim(t *testing.T) {
	a, st := open(t, t.TempDir(), "10.1.0.0/29")
	defer st.Close()
	claim := func(owner, ip string, takeOver func(string) bool) error {
		return st.Update(func(tx *store.Tx) error { return a.ClaimTx(tx, owner, netip.MustParseAddr(ip), takeOver) })
	}
	holder := func(ip string) string {
		var h string
		st.View(func(tx *store.Tx) error {
			h, _, _ = a.HolderTx(tx, netip.MustParseAddr(ip))
			return nil
		})
		return h
	}
	// Outside the prefix: recorded, Lookup finds it, Allocate ignores it.
	if err := claim("vm/a", "10.9.0.7", nil); err != nil {
		t.Fatal(err)
	}
	if ip, ok, err := a.Lookup("vm/a"); err != nil || !ok || ip.String() != "10.9.0.7" {
		t.Fatalf("lookup = %v %v %v", ip, ok, err)
	}
	if err := claim("vm/a", "10.9.0.7", nil); err != nil {
		t.Errorf("claiming again: %v", err)
	}
	if err := claim("vm/a", "10.9.0.8", nil); !errors.Is(err, ErrTaken) {
		t.Errorf("a second address for one owner: %v, want ErrTaken", err)
	}
	// Inside: Allocate skips it.
	if err := claim("moved:vm-b", "10.1.0.1", nil); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		ip, err := a.Allocate("pod" + string(rune('0'+i)))
		if err != nil {
			t.Fatal(err)
		}
		if ip.String() == "10.1.0.1" {
			t.Fatalf("allocated the claimed %s", ip)
		}
	}
	if _, err := a.Allocate("pod-full"); !errors.Is(err, ErrExhausted) {
		t.Errorf("allocate with the rest taken: %v, want ErrExhausted", err)
	}
	// Another owner gets it only when the holder may give it up.
	if err := claim("vm/b", "10.1.0.1", nil); !errors.Is(err, ErrTaken) {
		t.Errorf("claim of a held address: %v, want ErrTaken", err)
	}
	if err := claim("vm/b", "10.1.0.1", func(h string) bool { return h == "moved:vm-x" }); !errors.Is(err, ErrTaken) {
		t.Errorf("claim refused by takeOver: %v, want ErrTaken", err)
	}
	if err := claim("vm/b", "10.1.0.1", func(h string) bool { return h == "moved:vm-b" }); err != nil || holder("10.1.0.1") != "vm/b" {
		t.Errorf("take over: %v, holder %q", err, holder("10.1.0.1"))
	}
	if err := claim("vm/c", "fd00::1", nil); err == nil {
		t.Error("an IPv6 claim in an IPv4 allocator succeeded")
	}
	if err := a.Release("vm/b"); err != nil || holder("10.1.0.1") != "" {
		t.Errorf("release: %v, holder %q", err, holder("10.1.0.1"))
	}
}

// TestClaimRefusesReserved: no claim may take an address no endpoint can
// hold: this prefix's network and broadcast addresses (IPv6: the
// subnet-router anycast), the pods' link-local gateway, loopback,
// multicast, unspecified; the usable ones of both families are claimed.
func TestClaimRefusesReserved(t *testing.T) {
	for _, tc := range []struct {
		cidr string
		bad  []string
		good []string
	}{
		{"10.1.0.0/29", []string{"10.1.0.0", "10.1.0.7", "169.254.1.1", "127.0.0.1", "224.0.0.1", "0.0.0.0"}, []string{"10.1.0.1", "10.1.0.6", "10.9.0.7"}},
		{"fd00:10::/125", []string{"fd00:10::", "fe80::1", "::1", "ff02::1", "::"}, []string{"fd00:10::1", "fd00:10::7", "fd00:99::5"}},
	} {
		a, st := open(t, t.TempDir(), tc.cidr)
		for i, ip := range append(tc.bad, tc.good...) {
			err := st.Update(func(tx *store.Tx) error { return a.ClaimTx(tx, "vm/"+ip, netip.MustParseAddr(ip), nil) })
			if bad := i < len(tc.bad); bad != errors.Is(err, ErrReserved) {
				t.Errorf("%s: claim %s: %v (want reserved: %v)", tc.cidr, ip, err, bad)
			}
		}
		st.Close()
	}
}
