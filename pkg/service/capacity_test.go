package service

import (
	"fmt"
	"net/netip"
	"testing"
)

func capFrontend(i, backends int) *Frontend {
	f := &Frontend{Key: FrontendKey{Addr: netip.AddrFrom4([4]byte{10, 96, 0, byte(i)}), Port: 80, Proto: TCP, Scope: ScopeClusterIP},
		Service: ServiceID{Namespace: "ns", Name: fmt.Sprintf("s%d", i)}}
	for b := range backends {
		f.Backends = append(f.Backends, Backend{Addr: netip.AddrFrom4([4]byte{10, 244, byte(i), byte(b + 1)}), Port: 8080})
	}
	return f
}

// More frontends and backends than the maps hold: what does not fit waits
// (never a partial write), is reported with the full map, and is programmed
// once a removal or a shrink frees room; the counts never pass the capacity.
func TestTablesCapacity(t *testing.T) {
	tb := NewTables()
	tb.SetCapacity(Capacity{Frontends: 3, Backends: 5})
	u := tb.Apply(Changes{Upserted: []*Frontend{capFrontend(1, 2), capFrontend(2, 2), capFrontend(3, 2), capFrontend(4, 0)}})
	// s1, s2 fit (4 backends); s3 needs 2 more backends: waits on
	// lk_lb_backends; s4 (no backends) fits as the third frontend.
	if len(u.Services) != 3 || len(u.Backends) != 4 {
		t.Fatalf("programmed %d frontends, %d backends; want 3, 4", len(u.Services), len(u.Backends))
	}
	un := tb.Unprogrammed()
	if len(un) != 1 || un[0].Service.Name != "s3" || un[0].Map != MapBackends || un[0].Stale {
		t.Fatalf("unprogrammed %+v, want s3 on %s", un, MapBackends)
	}
	fill := tb.Fill()
	if fill[0] != (MapFill{MapFrontends, 3, 3}) || fill[2] != (MapFill{MapBackends, 4, 5}) {
		t.Errorf("fill %+v", fill)
	}
	// A new frontend with the frontend map full waits on lk_lb_svc.
	tb.Apply(Changes{Upserted: []*Frontend{capFrontend(5, 0)}})
	if un := tb.Unprogrammed(); len(un) != 2 || un[1].Map != MapFrontends {
		t.Fatalf("unprogrammed %+v, want s5 on %s", un, MapFrontends)
	}
	// s1 grows past the backends' room: its earlier version stays (stale).
	u = tb.Apply(Changes{Upserted: []*Frontend{capFrontend(1, 4)}})
	if u.Ops() != 0 {
		t.Errorf("a frontend that does not fit wrote %d entries", u.Ops())
	}
	if un := tb.Unprogrammed(); len(un) != 3 || un[0].Service.Name != "s1" || !un[0].Stale {
		t.Fatalf("unprogrammed %+v, want s1 stale first", un)
	}
	// s2 goes: 2 backends and a frontend free; s1 (4 backends, 2 more)
	// fits first in key order, then s3 does not (6+... > 5) and s5 takes
	// the frontend.
	u = tb.Apply(Changes{Removed: []FrontendKey{capFrontend(2, 0).Key}})
	if len(u.Backends) != 2 || len(u.Services) != 1 {
		t.Errorf("after s2 left: %d backends, %d services written; want 2 (s1's new), 1 (s5)", len(u.Backends), len(u.Services))
	}
	un = tb.Unprogrammed()
	if len(un) != 1 || un[0].Service.Name != "s3" {
		t.Fatalf("unprogrammed %+v, want only s3", un)
	}
	// s1 shrinks to none and s4 goes: s3 fits.
	tb.Apply(Changes{Upserted: []*Frontend{capFrontend(1, 0)}, Removed: []FrontendKey{capFrontend(4, 0).Key}})
	if un := tb.Unprogrammed(); len(un) != 0 {
		t.Errorf("unprogrammed %+v after room returned", un)
	}
	if f := tb.Fill(); f[0].Entries != 3 || f[2].Entries != 2 {
		t.Errorf("fill %+v, want 3 frontends, 2 backends", f)
	}
	// A waiting frontend that is removed is forgotten.
	tb.Apply(Changes{Upserted: []*Frontend{capFrontend(6, 0)}})
	tb.Apply(Changes{Removed: []FrontendKey{capFrontend(6, 0).Key}})
	if un := tb.Unprogrammed(); len(un) != 0 {
		t.Errorf("a removed frontend still waits: %+v", un)
	}
}
