package bench

import (
	"fmt"
	"net/netip"
	"strings"
)

// The rule generators below render a SvcSet the way kube-proxy lays it out
// (kubernetes pkg/proxy/iptables and pkg/proxy/nftables proxier.go: chain
// names, rule shapes, what a full sync writes and what a partial sync after
// one EndpointSlice change writes), for ClusterIP TCP services with
// internalTrafficPolicy Cluster, no session affinity, no NodePorts. Masquerade
// mark 0x4000, as kube-proxy's default.

// kubeLargeClusterEndpoints is kube-proxy's iptables threshold above which it
// drops the per-endpoint rule comments ("large cluster mode").
const kubeLargeClusterEndpoints = 1000

// iptables chain names: KUBE-SVC-/KUBE-SEP- and 16 hash characters.
func iptSvcChain(svc *Svc, p SvcPort) string {
	return "KUBE-SVC-" + kubeHash(svc.portName(p)+"tcp", 16)
}

func iptSepChain(svc *Svc, p SvcPort, ep netip.Addr) string {
	return "KUBE-SEP-" + kubeHash(svc.portName(p)+"tcp"+epString(ep, p), 16)
}

func epString(ep netip.Addr, p SvcPort) string { return fmt.Sprintf("%s:%d", ep, p.TargetPort) }

// IptablesFull is what kube-proxy's iptables mode programs on a node with no
// rules: the jumps from the built-in chains (kube-proxy adds them with
// iptables -I before its first restore; here they are part of the one
// restore) and a full sync of the filter and nat tables. Load it with
// `iptables-restore --noflush`.
func (s *SvcSet) IptablesFull() string {
	return s.iptablesRender(iptOpts{jumps: true, all: true, nodeports: true})
}

// IptablesPartial is kube-proxy's partial sync after service `changed`
// changed from old to s: the filter table and the nat table's top-level
// chains (KUBE-SERVICES with a rule for every service) in full, the changed
// service's chains rewritten and its chains that no longer exist flushed and
// deleted (-X). Load it with `iptables-restore --noflush`.
func (s *SvcSet) IptablesPartial(old *SvcSet, changed int) string {
	o := iptOpts{all: true, nodeports: true, from: changed, to: changed + 1}
	if changed >= 0 && changed < len(s.Services) && changed < len(old.Services) {
		o.stale = staleSepChains(&old.Services[changed], &s.Services[changed])
	}
	return s.iptablesRender(o)
}

// IptablesChunks loads the same rules as IptablesFull in restores of size
// services each (the first sets up the jumps and top-level chains, each
// appends its services' KUBE-SERVICES rules and chains, the last adds the
// nodeports rule): a way to get a large ruleset into the kernel when one
// restore of it takes too long. Not how kube-proxy syncs.
func (s *SvcSet) IptablesChunks(size int) []string {
	size = max(size, 1)
	var out []string
	for from := 0; from < len(s.Services); from += size {
		to := min(from+size, len(s.Services))
		out = append(out, s.iptablesRender(iptOpts{jumps: from == 0, top: from == 0, from: from, to: to,
			appendOnly: from > 0, nodeports: to == len(s.Services)}))
	}
	return out
}

// iptOpts select what iptablesRender writes.
type iptOpts struct {
	jumps      bool     // the built-in chains' jump rules
	all        bool     // every service's KUBE-SERVICES rule and every chain (full sync) ...
	top        bool     // declare and fill the top-level chains (implied by all)
	from, to   int      // ... else the chains of services [from, to)
	appendOnly bool     // chunk: only append to KUBE-SERVICES, declare nothing top-level
	nodeports  bool     // the KUBE-SERVICES nodeports rule (last in the chain)
	stale      []string // endpoint chains to flush and delete
}

func (s *SvcSet) iptablesRender(o iptOpts) string {
	full := o.all && o.from == 0 && o.to == 0
	if full {
		o.to = len(s.Services)
	}
	top := o.all || o.top
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	large := s.Endpoints() > kubeLargeClusterEndpoints
	comment := func(text string) string {
		if large {
			return ""
		}
		return fmt.Sprintf("-m comment --comment %s ", quoteComment(text))
	}

	if !o.appendOnly {
		w("*filter")
		for _, c := range []string{"KUBE-NODEPORTS", "KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-PROXY-FIREWALL"} {
			w(":%s - [0:0]", c)
		}
		if o.jumps {
			w(`-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL`)
			w(`-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS`)
			w(`-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES`)
			w(`-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL`)
			w(`-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD`)
			w(`-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
			w(`-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES`)
			w(`-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL`)
			w(`-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
		}
		w(`-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP`)
		w(`-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT`)
		w(`-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`)
		w("COMMIT")
	}

	w("*nat")
	if top {
		for _, c := range []string{"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ"} {
			w(":%s - [0:0]", c)
		}
	}
	// Chains of the services written in this restore, and stale ones.
	for i := o.from; i < o.to; i++ {
		svc := &s.Services[i]
		for _, p := range svc.Ports {
			w(":%s - [0:0]", iptSvcChain(svc, p))
			for _, ep := range svc.Endpoints {
				w(":%s - [0:0]", iptSepChain(svc, p, ep))
			}
		}
	}
	for _, c := range o.stale {
		w(":%s - [0:0]", c)
	}
	if o.jumps {
		w(`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
		w(`-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
		w(`-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`)
	}
	svcRulesFrom, svcRulesTo := o.from, o.to
	if o.all {
		svcRulesFrom, svcRulesTo = 0, len(s.Services)
	}
	for i := svcRulesFrom; i < svcRulesTo; i++ {
		svc := &s.Services[i]
		for _, p := range svc.Ports {
			w(`-A KUBE-SERVICES -m comment --comment %s -m tcp -p tcp -d %s/32 --dport %d -j %s`,
				quoteComment(svc.portName(p)+" cluster IP"), svc.IP, p.Port, iptSvcChain(svc, p))
		}
	}
	if o.nodeports {
		w(`-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS`)
	}
	if top {
		w(`-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000`)
		w(`-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN`)
		w(`-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000`)
		w(`-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`)
	}
	for i := o.from; i < o.to; i++ {
		svc := &s.Services[i]
		for _, p := range svc.Ports {
			svcChain, name := iptSvcChain(svc, p), svc.portName(p)
			w(`-A %s -m comment --comment %s -m tcp -p tcp -d %s/32 --dport %d ! -s %s -j KUBE-MARK-MASQ`,
				svcChain, quoteComment(name+" cluster IP"), svc.IP, p.Port, s.ClusterCIDR)
			n := len(svc.Endpoints)
			for k, ep := range svc.Endpoints {
				stat := ""
				if k < n-1 {
					stat = fmt.Sprintf("-m statistic --mode random --probability %0.10f ", 1.0/float64(n-k))
				}
				w(`-A %s %s%s-j %s`, svcChain, comment(name+" -> "+epString(ep, p)), stat, iptSepChain(svc, p, ep))
			}
			for _, ep := range svc.Endpoints {
				sep := iptSepChain(svc, p, ep)
				w(`-A %s %s-s %s/32 -j KUBE-MARK-MASQ`, sep, comment(name), ep)
				w(`-A %s %s-m tcp -p tcp -j DNAT --to-destination %s`, sep, comment(name), epString(ep, p))
			}
		}
	}
	for _, c := range o.stale {
		w("-X %s", c)
	}
	w("COMMIT")
	return b.String()
}

// staleSepChains lists the endpoint chains of old that cur no longer has.
func staleSepChains(old, cur *Svc) []string {
	keep := map[string]bool{}
	for _, p := range cur.Ports {
		for _, ep := range cur.Endpoints {
			keep[iptSepChain(cur, p, ep)] = true
		}
	}
	var out []string
	for _, p := range old.Ports {
		for _, ep := range old.Endpoints {
			if c := iptSepChain(old, p, ep); !keep[c] {
				out = append(out, c)
			}
		}
	}
	return out
}

// quoteComment quotes a comment that has spaces, as kube-proxy does.
func quoteComment(s string) string {
	if strings.ContainsAny(s, " \t") {
		return `"` + s + `"`
	}
	return s
}

// nftables chain names: a prefix, 8 hash characters and the readable name.
func nftSvcChain(svc *Svc, p SvcPort) string {
	return "service-" + nftNameBase(fmt.Sprintf("%s/%s/tcp/%s", svc.Namespace, svc.Name, p.Name))
}

func nftEpChain(svc *Svc, p SvcPort, ep netip.Addr) string {
	return "endpoint-" + nftNameBase(fmt.Sprintf("%s/%s/tcp/%s__%s/%d", svc.Namespace, svc.Name, p.Name, ep, p.TargetPort))
}

func nftNameBase(name string) string { return kubeHash(name, 8) + "-" + name }

// NftTable is kube-proxy's nftables table ("ip kube-proxy").
const NftTable = "kube-proxy"

// NftFull is the transaction kube-proxy's nftables mode runs on its first
// (full) sync: the table, base chains, the dispatch maps with one element per
// service port, and every service and endpoint chain. Load it with `nft -f`.
func (s *SvcSet) NftFull() string {
	return s.nftSync(nil, -1)
}

// NftPartial is the transaction of kube-proxy's nftables partial sync after
// service `changed` changed from old to s: that service's chain and its
// endpoints' chains re-created and refilled, the chains of removed endpoints
// flushed (kube-proxy deletes them in a later transaction); the maps only
// change when the service's ports do, which this change does not touch.
func (s *SvcSet) NftPartial(old *SvcSet, changed int) string {
	return s.nftSync(old, changed)
}

func (s *SvcSet) nftSync(old *SvcSet, changed int) string {
	full := old == nil
	var b strings.Builder
	t := "ip " + NftTable
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	created := map[string]bool{}
	chain := func(name string) { // kube-proxy's ensureChain: add, then flush, once
		if !created[name] {
			created[name] = true
			w("add chain %s %s", t, name)
			w("flush chain %s %s", t, name)
		}
	}
	if full {
		w(`add table %s { comment "rules for kube-proxy" ; }`, t)
		for _, bc := range []struct{ name, typ, hook, prio string }{
			// dstnat is -100, srcnat 100 (numbers: nft 1.0 takes the names
			// only on the hooks they are defined for).
			{"filter-prerouting", "filter", "prerouting", "-110"},
			{"filter-input", "filter", "input", "-110"},
			{"filter-forward", "filter", "forward", "-110"},
			{"filter-output", "filter", "output", "-110"},
			{"nat-prerouting", "nat", "prerouting", "-100"},
			{"nat-output", "nat", "output", "-100"},
			{"nat-postrouting", "nat", "postrouting", "100"},
		} {
			w("add chain %s %s { type %s hook %s priority %s ; }", t, bc.name, bc.typ, bc.hook, bc.prio)
			w("flush chain %s %s", t, bc.name)
		}
		for _, j := range []struct{ dst, src, extra string }{
			{"endpoints-check", "filter-input", "ct state new "},
			{"endpoints-check", "filter-forward", "ct state new "},
			{"endpoints-check", "filter-output", "ct state new "},
			{"firewall-check", "filter-prerouting", "ct state new "},
			{"firewall-check", "filter-output", "ct state new "},
			{"services", "nat-output", ""},
			{"services", "nat-prerouting", ""},
			{"masquerading", "nat-postrouting", ""},
		} {
			chain(j.dst)
			w("add rule %s %s %sjump %s", t, j.src, j.extra, j.dst)
		}
		chain("mark-for-masquerade")
		w("add rule %s mark-for-masquerade mark set mark or 0x4000", t)
		w("add rule %s masquerading mark and 0x4000 == 0 return", t)
		w("add rule %s masquerading mark set mark xor 0x4000", t)
		w("add rule %s masquerading masquerade fully-random", t)
		w(`add map %s no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }`, t)
		w(`add map %s no-endpoint-nodeports { type inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }`, t)
		w(`add chain %s reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }`, t)
		w("flush chain %s reject-chain", t)
		w("add rule %s reject-chain reject", t)
		w("add rule %s endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services", t)
		w("add rule %s endpoints-check fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @no-endpoint-nodeports", t)
		w(`add map %s firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "destinations that are subject to LoadBalancerSourceRanges" ; }`, t)
		w("add rule %s firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips", t)
		w(`add map %s service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }`, t)
		w(`add map %s service-nodeports { type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }`, t)
		w("add rule %s services ip daddr . meta l4proto . th dport vmap @service-ips", t)
		w("add rule %s services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports", t)
		for _, m := range []string{"firewall-ips", "no-endpoint-services", "no-endpoint-nodeports", "service-ips", "service-nodeports"} {
			w("flush map %s %s", t, m)
		}
	}
	for i := range s.Services {
		if !full && i != changed {
			continue
		}
		svc := &s.Services[i]
		for _, p := range svc.Ports {
			for _, ep := range svc.Endpoints {
				chain(nftEpChain(svc, p, ep))
			}
			chain(nftSvcChain(svc, p))
		}
	}
	for i := range s.Services {
		if !full && i != changed {
			continue
		}
		svc := &s.Services[i]
		for _, p := range svc.Ports {
			sc := nftSvcChain(svc, p)
			if full {
				w("add element %s service-ips { %s . tcp . %d : goto %s }", t, svc.IP, p.Port, sc)
			}
			w("add rule %s %s ip daddr %s tcp dport %d ip saddr != %s jump mark-for-masquerade", t, sc, svc.IP, p.Port, s.ClusterCIDR)
			var elems []string
			for k, ep := range svc.Endpoints {
				elems = append(elems, fmt.Sprintf("%d : goto %s", k, nftEpChain(svc, p, ep)))
			}
			w("add rule %s %s numgen random mod %d vmap { %s }", t, sc, len(svc.Endpoints), strings.Join(elems, " , "))
			for _, ep := range svc.Endpoints {
				ec := nftEpChain(svc, p, ep)
				w("add rule %s %s ip saddr %s jump mark-for-masquerade", t, ec, ep)
				w("add rule %s %s meta l4proto tcp dnat to %s", t, ec, epString(ep, p))
			}
		}
	}
	if !full && changed < len(old.Services) {
		cur, prev := &s.Services[changed], &old.Services[changed]
		keep := map[string]bool{}
		for _, p := range cur.Ports {
			for _, ep := range cur.Endpoints {
				keep[nftEpChain(cur, p, ep)] = true
			}
		}
		for _, p := range prev.Ports {
			for _, ep := range prev.Endpoints {
				if c := nftEpChain(prev, p, ep); !keep[c] {
					w("flush chain %s %s", t, c)
				}
			}
		}
	}
	return b.String()
}
