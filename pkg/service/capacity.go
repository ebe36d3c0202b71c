package service

import (
	"cmp"
	"slices"
)

// Map names the capacity reports use: the datapath's pinned maps a
// frontend or a backend takes an entry of. A frontend also takes one entry
// of lk_lb_revnat(6) and, with backends, of lk_lb_maglev: those maps have
// lk_lb_svc's size.
const (
	MapFrontends  = "lk_lb_svc"
	MapFrontends6 = "lk_lb_svc6"
	MapBackends   = "lk_lb_backends"
	MapBackends6  = "lk_lb_backends6"
)

// Capacity is how many entries the service maps hold: Frontends for
// lk_lb_svc, lk_lb_svc6, lk_lb_revnat(6) and lk_lb_maglev, Backends for
// lk_lb_backends(6) (every frontend's backends count: a Service with a
// ClusterIP and a NodePort on two node addresses takes its backends three
// times). 0: unlimited.
type Capacity struct{ Frontends, Backends int }

// MapFill is how full one map is.
type MapFill struct {
	Map               string
	Entries, Capacity int // Capacity 0: unlimited
}

// Unprogrammed is a frontend the maps had no room for: the datapath does not
// serve it (a new frontend) or serves its earlier backend set (a frontend
// whose backends grew). It is programmed as soon as room returns.
type Unprogrammed struct {
	Key     FrontendKey
	Service ServiceID
	Map     string // the map that is full
	// Stale: an earlier version of the frontend is programmed.
	Stale bool
}

// usage counts the entries programmed, by family (index 1: IPv6).
type usage struct{ fronts, backs [2]int }

func family(k FrontendKey) int {
	if k.is6() {
		return 1
	}
	return 0
}

// SetCapacity sets the maps' sizes; frontends that do not fit from then on
// wait (Unprogrammed). Frontends programmed already stay.
func (t *Tables) SetCapacity(c Capacity) { t.capacity = c }

// fits says whether f can be programmed now, and if not which map is full.
func (t *Tables) fits(f *Frontend) (string, bool) {
	fam := family(f.Key)
	needF, needB := 1, len(f.Backends)
	if p, ok := t.fronts[f.Key]; ok {
		needF, needB = 0, len(f.Backends)-len(p.backends)
	}
	if c := t.capacity.Frontends; c > 0 && needF > 0 && t.used.fronts[fam]+needF > c {
		return [2]string{MapFrontends, MapFrontends6}[fam], false
	}
	if c := t.capacity.Backends; c > 0 && needB > 0 && t.used.backs[fam]+needB > c {
		return [2]string{MapBackends, MapBackends6}[fam], false
	}
	return "", true
}

// upsertOrWait programs f if it fits, else keeps it waiting; it reports
// whether f was programmed.
func (t *Tables) upsertOrWait(f *Frontend, u *Update) bool {
	if m, ok := t.fits(f); !ok {
		_, stale := t.fronts[f.Key]
		t.waiting[f.Key] = waitingFrontend{f: f, m: m, stale: stale}
		return false
	}
	delete(t.waiting, f.Key)
	t.upsert(f, u)
	return true
}

// retryWaiting programs the waiting frontends that fit now, in key order
// (the same order on every node and after a restart).
func (t *Tables) retryWaiting(u *Update) {
	if len(t.waiting) == 0 {
		return
	}
	keys := make([]FrontendKey, 0, len(t.waiting))
	for k := range t.waiting {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareFrontendKeys)
	for _, k := range keys {
		t.upsertOrWait(t.waiting[k].f, u)
	}
}

func compareFrontendKeys(a, b FrontendKey) int {
	return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Scope, b.Scope))
}

// Unprogrammed returns the frontends waiting for room, in key order.
func (t *Tables) Unprogrammed() []Unprogrammed {
	out := make([]Unprogrammed, 0, len(t.waiting))
	for k, w := range t.waiting {
		out = append(out, Unprogrammed{Key: k, Service: w.f.Service, Map: w.m, Stale: w.stale})
	}
	slices.SortFunc(out, func(a, b Unprogrammed) int { return compareFrontendKeys(a.Key, b.Key) })
	return out
}

// Fill returns the entries each service map holds against its capacity.
func (t *Tables) Fill() []MapFill {
	return []MapFill{
		{MapFrontends, t.used.fronts[0], t.capacity.Frontends},
		{MapFrontends6, t.used.fronts[1], t.capacity.Frontends},
		{MapBackends, t.used.backs[0], t.capacity.Backends},
		{MapBackends6, t.used.backs[1], t.capacity.Backends},
	}
}

// recount counts the programmed entries again (after Adopt filled the
// tables from the pinned maps).
func (t *Tables) recount() {
	t.used = usage{}
	for k, p := range t.fronts {
		t.used.fronts[family(k)]++
		t.used.backs[family(k)] += len(p.backends)
	}
}
