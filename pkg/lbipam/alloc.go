package lbipam

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Reasons of a Service's ConditionType condition (and its events).
const (
	ReasonAssigned  = "Assigned"
	ReasonExhausted = "PoolExhausted"
	ReasonConflict  = "AddressInUse"
	ReasonNoPool    = "NoPool"
	ReasonNotInPool = "NotInPool"
	ReasonInvalid   = "InvalidRequest"
)

// Error is why a Service got no (or not every) address.
type Error struct {
	Reason string // one of the Reason constants
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

// Want is what one Service asks of the allocator.
type Want struct {
	Key      string // namespace/name
	Created  time.Time
	Families []corev1.IPFamily // spec.ipFamilies; empty: IPv4
	// Requested addresses (spec.loadBalancerIP, AnnotationIPs): when set,
	// the Service gets exactly these or an error.
	Requested []netip.Addr
	// Current addresses in its status that lanekit assigned: kept while they
	// are still valid, so a restarted or new leader moves nothing.
	Current []netip.Addr
	Subject Subject
}

// Result is one Service's assignment.
type Result struct {
	Addrs []netip.Addr // one per family, in Families (or Requested) order
	Err   *Error       // nil: every family (or request) satisfied
}

// allocator holds the addresses taken during one Plan.
type allocator struct {
	pools []*Pool
	owner map[netip.Addr]string
}

// Plan assigns addresses to every Service in wants, from nothing but the
// pools and the Services themselves: current assignments first (oldest
// Service first, so of two Services holding one address the older keeps
// it), then requested addresses, then free addresses for the families still
// missing. An address is never given to two Services.
func Plan(pools []*Pool, wants []Want) map[string]Result {
	wants = slices.Clone(wants)
	slices.SortFunc(wants, func(a, b Want) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
	al := &allocator{pools: pools, owner: map[netip.Addr]string{}}
	got := make(map[string][]netip.Addr, len(wants))
	out := make(map[string]Result, len(wants))
	// 1. Keep what each Service holds and still may hold.
	for _, w := range wants {
		for _, a := range w.Current {
			if !w.wants(a) || slices.ContainsFunc(got[w.Key], func(b netip.Addr) bool { return b.BitLen() == a.BitLen() }) {
				continue
			}
			if al.claim(w, a) == nil {
				got[w.Key] = append(got[w.Key], a)
			}
		}
	}
	// 2. Requested addresses.
	for _, w := range wants {
		if len(w.Requested) == 0 {
			continue
		}
		if err := w.checkRequest(); err != nil {
			out[w.Key] = Result{Err: err}
			continue
		}
		var r Result
		for _, a := range w.Requested {
			if slices.Contains(got[w.Key], a) {
				continue
			}
			if err := al.claim(w, a); err != nil {
				r.Err = err
				continue
			}
			got[w.Key] = append(got[w.Key], a)
		}
		out[w.Key] = r
	}
	// 3. A free address for each family still missing.
	for _, w := range wants {
		if len(w.Requested) > 0 {
			continue
		}
		var r Result
		for _, f := range w.families() {
			if slices.ContainsFunc(got[w.Key], func(a netip.Addr) bool { return familyOf(a) == f }) {
				continue
			}
			a, err := al.next(w, f)
			if err != nil {
				r.Err = err
				continue
			}
			got[w.Key] = append(got[w.Key], a)
		}
		out[w.Key] = r
	}
	for _, w := range wants {
		r := out[w.Key]
		r.Addrs = w.order(got[w.Key])
		out[w.Key] = r
	}
	return out
}

func (w Want) families() []corev1.IPFamily {
	if len(w.Families) == 0 {
		return []corev1.IPFamily{corev1.IPv4Protocol}
	}
	return w.Families
}

// wants reports whether a current address is still what w asks for.
func (w Want) wants(a netip.Addr) bool {
	if len(w.Requested) > 0 {
		return slices.Contains(w.Requested, a)
	}
	return slices.Contains(w.families(), familyOf(a))
}

// order sorts addrs by w's family order (the primary family first).
func (w Want) order(addrs []netip.Addr) []netip.Addr {
	rank := func(a netip.Addr) int {
		if i := slices.Index(w.Requested, a); i >= 0 {
			return i
		}
		return slices.Index(w.families(), familyOf(a))
	}
	slices.SortFunc(addrs, func(a, b netip.Addr) int { return cmp.Compare(rank(a), rank(b)) })
	return addrs
}

func (w Want) checkRequest() *Error {
	var fams []corev1.IPFamily
	for _, a := range w.Requested {
		f := familyOf(a)
		if slices.Contains(fams, f) {
			return &Error{ReasonInvalid, fmt.Sprintf("requested addresses %s: more than one %s address", joinAddrs(w.Requested), f)}
		}
		if !slices.Contains(w.families(), f) {
			return &Error{ReasonInvalid, fmt.Sprintf("requested address %s is %s but the Service's ipFamilies are %v", a, f, w.families())}
		}
		fams = append(fams, f)
	}
	return nil
}

// claim gives a to w if a pool matching w holds it and no other Service has it.
func (al *allocator) claim(w Want, a netip.Addr) *Error {
	if o, ok := al.owner[a]; ok && o != w.Key {
		return &Error{ReasonConflict, fmt.Sprintf("address %s is already assigned to Service %s", a, o)}
	}
	in := false
	for _, p := range al.pools {
		if p.Contains(a) {
			if !p.Matches(w.Subject) {
				return &Error{ReasonNotInPool, fmt.Sprintf("address %s is in pool %q, whose selectors do not match the Service", a, p.Name)}
			}
			in = true
			break
		}
	}
	if !in {
		return &Error{ReasonNotInPool, fmt.Sprintf("address %s is in no LoadBalancer address pool", a)}
	}
	al.owner[a] = w.Key
	return nil
}

// next takes the lowest free address of family f from the first pool (by
// name) that matches w and has one.
func (al *allocator) next(w Want, f corev1.IPFamily) (netip.Addr, *Error) {
	var matched []string
	for _, p := range al.pools {
		if !p.Matches(w.Subject) {
			continue
		}
		for _, r := range p.Ranges {
			if familyOf(r.First) != f {
				continue
			}
			matched = append(matched, p.Name)
			for a := r.First; a.IsValid() && a.Compare(r.Last) <= 0; a = a.Next() {
				if _, taken := al.owner[a]; !taken {
					al.owner[a] = w.Key
					return a, nil
				}
			}
		}
	}
	if len(matched) == 0 {
		return netip.Addr{}, &Error{ReasonNoPool, fmt.Sprintf("no LoadBalancer address pool with %s addresses matches the Service", f)}
	}
	slices.Sort(matched)
	return netip.Addr{}, &Error{ReasonExhausted, fmt.Sprintf("no free %s address in pools %s", f, strings.Join(slices.Compact(matched), ", "))}
}

func familyOf(a netip.Addr) corev1.IPFamily {
	if a.Is4() {
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}

func joinAddrs(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ",")
}
