package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"

	"github.com/lanekit/lanekit/pkg/store"
)

func open(t *testing.T, dir, cidr string) (*IPAM, *store.Store) {
	t.Helper()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(st, netip.MustParsePrefix(cidr))
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	return a, st
}

func TestFillsRangeSkippingNetworkAndBroadcast(t *testing.T) {
	a, st := open(t, t.TempDir(), "10.1.0.0/29")
	defer st.Close()
	if a.Capacity() != 6 {
		t.Fatalf("capacity = %d, want 6", a.Capacity())
	}
	var got []string
	for i := range 6 {
		ip, err := a.Allocate(fmt.Sprintf("c%d/eth0", i))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ip.String())
	}
	want := []string{"10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.4", "10.1.0.5", "10.1.0.6"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("allocated %v, want %v", got, want)
	}
	if _, err := a.Allocate("c7/eth0"); !errors.Is(err, ErrExhausted) {
		t.Fatalf("7th allocation err = %v, want ErrExhausted", err)
	}
	// Free a hole in the middle: the search wraps around to it.
	if err := a.Release("c2/eth0"); err != nil {
		t.Fatal(err)
	}
	ip, err := a.Allocate("c8/eth0")
	if err != nil || ip.String() != "10.1.0.3" {
		t.Fatalf("after release got %v %v, want 10.1.0.3", ip, err)
	}
}

// TestRotatesAfterLastReserved: like host-local, a just-freed address is not
// handed out again while later ones are free, and the cursor survives a
// restart.
func TestRotatesAfterLastReserved(t *testing.T) {
	dir := t.TempDir()
	a, st := open(t, dir, "10.1.0.0/29") // .1 - .6
	alloc := func(owner string) string {
		t.Helper()
		ip, err := a.Allocate(owner)
		if err != nil {
			t.Fatalf("allocate %s: %v", owner, err)
		}
		return ip.String()
	}
	if got := alloc("a/eth0"); got != "10.1.0.1" {
		t.Fatalf("first = %s", got)
	}
	if err := a.Release("a/eth0"); err != nil {
		t.Fatal(err)
	}
	if got := alloc("b/eth0"); got != "10.1.0.2" {
		t.Fatalf("after freeing .1 got %s, want 10.1.0.2 (no immediate reuse)", got)
	}
	alloc("c/eth0") // .3
	a.Release("c/eth0")
	st.Close()

	a, st = open(t, dir, "10.1.0.0/29")
	defer st.Close()
	var got []string
	for _, o := range []string{"d", "e", "f", "g", "h"} {
		got = append(got, alloc(o+"/eth0"))
	}
	// .4 .5 .6 after the persisted cursor (.3), then wrap: .1, then .3 (.2 is b's).
	want := []string{"10.1.0.4", "10.1.0.5", "10.1.0.6", "10.1.0.1", "10.1.0.3"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("allocated %v, want %v", got, want)
	}
	if _, err := a.Allocate("i/eth0"); !errors.Is(err, ErrExhausted) {
		t.Fatalf("full pool: %v, want ErrExhausted", err)
	}
}

func TestSameOwnerSameAddressAndIdempotentRelease(t *testing.T) {
	a, st := open(t, t.TempDir(), "10.1.0.0/24")
	defer st.Close()
	ip1, _ := a.Allocate("x/eth0")
	ip2, _ := a.Allocate("x/eth0")
	if ip1 != ip2 {
		t.Fatalf("same owner got %v then %v", ip1, ip2)
	}
	for range 2 {
		if err := a.Release("x/eth0"); err != nil {
			t.Fatalf("release: %v", err)
		}
	}
	if err := a.Release("never/eth0"); err != nil {
		t.Fatalf("release unknown: %v", err)
	}
	if all, _ := a.Allocations(); len(all) != 0 {
		t.Fatalf("allocations left: %v", all)
	}
	if _, err := a.Allocate(""); err == nil {
		t.Fatal("empty owner accepted")
	}
}

func TestSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	a, st := open(t, dir, "10.2.0.0/24")
	ip, _ := a.Allocate("keep/eth0")
	st.Close()

	a, st = open(t, dir, "10.2.0.0/24")
	defer st.Close()
	got, ok, err := a.Lookup("keep/eth0")
	if err != nil || !ok || got != ip {
		t.Fatalf("after restart lookup = %v %v %v, want %v", got, ok, err, ip)
	}
	other, _ := a.Allocate("new/eth0")
	if other == ip {
		t.Fatalf("double allocation of %v after restart", ip)
	}
}

func TestRefusesChangedCIDRWithAllocations(t *testing.T) {
	dir := t.TempDir()
	a, st := open(t, dir, "10.3.0.0/24")
	a.Allocate("a/eth0")
	st.Close()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := New(st, netip.MustParsePrefix("10.4.0.0/24")); !errors.Is(err, ErrCIDRChanged) {
		t.Fatalf("err = %v, want ErrCIDRChanged", err)
	}
	// IPv6 is its own family: its range is recorded apart from IPv4's.
	if _, err := New(st, netip.MustParsePrefix("fd00::/64")); err != nil {
		t.Fatalf("IPv6 prefix beside an IPv4 one: %v", err)
	}
}

func TestConcurrentNeverDoubleAllocates(t *testing.T) {
	a, st := open(t, t.TempDir(), "10.5.0.0/24")
	defer st.Close()
	var wg sync.WaitGroup
	ips := make([]netip.Addr, 100)
	errs := make([]error, 100)
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ips[i], errs[i] = a.Allocate(fmt.Sprintf("c%d/eth0", i))
		}()
	}
	wg.Wait()
	seen := map[netip.Addr]int{}
	for i, ip := range ips {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if j, dup := seen[ip]; dup {
			t.Fatalf("%v given to c%d and c%d", ip, j, i)
		}
		seen[ip] = i
	}
}

// TestIPv6FillsRangeAndWraps: an IPv6 pool skips only the subnet-router
// anycast address (the prefix itself; IPv6 has no broadcast), rotates and
// wraps like IPv4.
func TestIPv6FillsRangeAndWraps(t *testing.T) {
	a, st := open(t, t.TempDir(), "fd10:244:1::/126")
	defer st.Close()
	if a.Capacity() != 3 {
		t.Fatalf("capacity = %d, want 3", a.Capacity())
	}
	var got []string
	for i := range 3 {
		ip, err := a.Allocate(fmt.Sprintf("c%d/eth0", i))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ip.String())
	}
	if want := "[fd10:244:1::1 fd10:244:1::2 fd10:244:1::3]"; fmt.Sprint(got) != want {
		t.Fatalf("allocated %v, want %s", got, want)
	}
	if _, err := a.Allocate("c4/eth0"); !errors.Is(err, ErrExhausted) {
		t.Fatalf("4th allocation err = %v, want ErrExhausted", err)
	}
	if err := a.Release("c0/eth0"); err != nil {
		t.Fatal(err)
	}
	if ip, err := a.Allocate("c5/eth0"); err != nil || ip.String() != "fd10:244:1::1" {
		t.Fatalf("after release got %v %v, want the wrapped-to fd10:244:1::1", ip, err)
	}
	big, st2 := open(t, t.TempDir(), "fd10:244:2::/64")
	defer st2.Close()
	if big.Capacity() != int(^uint(0)>>1) {
		t.Fatalf("a /64's capacity %d, want the int cap", big.Capacity())
	}
}

// TestFamiliesAreIndependent: one owner holds one address per family, each
// family's release and changed-CIDR check touch only its own records.
func TestFamiliesAreIndependent(t *testing.T) {
	dir := t.TempDir()
	a4, st := open(t, dir, "10.6.0.0/24")
	a6, err := New(st, netip.MustParsePrefix("fd10:6::/64"))
	if err != nil {
		t.Fatal(err)
	}
	ip4, err := a4.Allocate("pod/eth0")
	if err != nil {
		t.Fatal(err)
	}
	ip6, err := a6.Allocate("pod/eth0")
	if err != nil {
		t.Fatal(err)
	}
	if !ip4.Is4() || !ip6.Is6() || ip6.String() != "fd10:6::1" {
		t.Fatalf("allocated %v and %v", ip4, ip6)
	}
	if got, ok, _ := a6.Lookup("pod/eth0"); !ok || got != ip6 {
		t.Fatalf("v6 lookup = %v %v, want %v", got, ok, ip6)
	}
	if got, ok, _ := a4.Lookup("pod/eth0"); !ok || got != ip4 {
		t.Fatalf("v4 lookup = %v %v, want %v", got, ok, ip4)
	}
	if al, _ := a4.Allocations(); len(al) != 1 || al[0].IP != ip4 {
		t.Fatalf("v4 allocations %v", al)
	}
	if err := a6.Release("pod/eth0"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := a4.Lookup("pod/eth0"); !ok {
		t.Fatal("releasing the IPv6 address released the IPv4 one")
	}
	// No IPv6 allocations left: the IPv6 range may change, the IPv4 one
	// (which has one) may not.
	if _, err := New(st, netip.MustParsePrefix("fd10:7::/64")); err != nil {
		t.Fatalf("changing an empty IPv6 range: %v", err)
	}
	if _, err := New(st, netip.MustParsePrefix("10.7.0.0/24")); !errors.Is(err, ErrCIDRChanged) {
		t.Fatalf("changing the used IPv4 range: err = %v, want ErrCIDRChanged", err)
	}
	st.Close()
}

func TestRefusesBadPrefixes(t *testing.T) {
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, p := range []string{"10.0.0.0/31", "fd00::/127", "::ffff:10.0.0.0/120"} {
		if _, err := New(st, netip.MustParsePrefix(p)); err == nil {
			t.Errorf("%s accepted", p)
		}
	}
}
