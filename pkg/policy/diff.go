package policy

import (
	"fmt"
	"net/netip"
)

// Update is the set of map operations that moves a datapath from one Compiled
// to the next. Apply upserts first (IPCache, CIDRs, Rules, then Isolated, so a
// newly isolated identity already has its allow rules), then deletes (Isolated
// first, so nothing is default-deny without its rules; then Rules, CIDRs,
// IPCache).
type Update struct {
	IPCache        map[netip.Addr]Identity
	CIDRs          map[netip.Prefix]Identity
	Rules          map[RuleKey]RuleValue
	Isolated       map[Identity]Isolation
	IsolatedDelete []Identity
	RulesDelete    []RuleKey
	CIDRsDelete    []netip.Prefix
	IPCacheDelete  []netip.Addr
}

// Ops is the number of map operations in u.
func (u *Update) Ops() int {
	return len(u.IPCache) + len(u.CIDRs) + len(u.Rules) + len(u.Isolated) +
		len(u.IsolatedDelete) + len(u.RulesDelete) + len(u.CIDRsDelete) + len(u.IPCacheDelete)
}

func (u *Update) String() string {
	return fmt.Sprintf("ipcache +%d -%d, cidrs +%d -%d, rules +%d -%d, isolated +%d -%d",
		len(u.IPCache), len(u.IPCacheDelete), len(u.CIDRs), len(u.CIDRsDelete),
		len(u.Rules), len(u.RulesDelete), len(u.Isolated), len(u.IsolatedDelete))
}

// Diff returns the map operations from old (nil = empty maps) to new. Identities
// must come from the same Identities allocator for the result to be minimal.
func Diff(old, new *Compiled) *Update {
	if old == nil {
		old = &Compiled{}
	}
	u := &Update{}
	u.IPCache, u.IPCacheDelete = diffMap(old.IPCache, new.IPCache)
	u.CIDRs, u.CIDRsDelete = diffMap(old.CIDRs, new.CIDRs)
	u.Rules, u.RulesDelete = diffMap(old.Rules, new.Rules)
	u.Isolated, u.IsolatedDelete = diffMap(old.Isolated, new.Isolated)
	return u
}

func diffMap[K comparable, V comparable](old, new map[K]V) (map[K]V, []K) {
	up := map[K]V{}
	for k, v := range new {
		if o, ok := old[k]; !ok || o != v {
			up[k] = v
		}
	}
	var del []K
	for k := range old {
		if _, ok := new[k]; !ok {
			del = append(del, k)
		}
	}
	return up, del
}
