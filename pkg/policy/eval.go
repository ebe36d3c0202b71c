package policy

import (
	"fmt"
	"net/netip"
)

// IdentityOf resolves an IP as the datapath does first: an endpoint IP to
// its endpoint identity (exact match wins), any other IP to its CIDR identity
// (CIDRIdentityOf). endpoint reports whether the IP is a known endpoint.
func (c *Compiled) IdentityOf(ip netip.Addr) (id Identity, endpoint bool) {
	if id, ok := c.IPCache[ip]; ok {
		return id, true
	}
	return c.CIDRIdentityOf(ip), false
}

// CIDRIdentityOf is the CIDR identity of ip's longest matching ipBlock prefix
// (IdentityWorld when none), whether or not ip is an endpoint: what an
// ipBlock peer matches by address.
func (c *Compiled) CIDRIdentityOf(ip netip.Addr) Identity {
	for bits := ip.BitLen(); bits >= 0; bits-- {
		p, err := ip.Prefix(bits)
		if err != nil {
			continue
		}
		if id, ok := c.CIDRs[p]; ok {
			return id
		}
	}
	if ip.Is6() {
		return IdentityWorld6
	}
	return IdentityWorld
}

// LookupPeer finds the rule allowing (subject, dir, the peer at ip, proto,
// port) as the datapath does: by the peer's identity (Lookup), then, when
// the peer is an endpoint and nothing matched, by its address (its CIDR
// identity, the ipBlocks covering it): a peer matches by identity or by
// address, the union of the two.
func (c *Compiled) LookupPeer(subject Identity, dir Direction, ip netip.Addr, proto uint8, port uint16) (RuleValue, bool) {
	id, ep := c.IdentityOf(ip)
	if v, ok := c.Lookup(subject, dir, id, proto, port); ok || !ep {
		return v, ok
	}
	return c.Lookup(subject, dir, c.CIDRIdentityOf(ip), proto, port)
}

// Lookup finds the rule allowing (subject, dir, peer, proto, port) the way a
// BPF datapath does with an LPM trie: peer exact then IdentityAny, proto exact
// then ProtoAny, longest port prefix first.
func (c *Compiled) Lookup(subject Identity, dir Direction, peer Identity, proto uint8, port uint16) (RuleValue, bool) {
	for _, pe := range []Identity{peer, IdentityAny} {
		for _, pr := range []uint8{proto, ProtoAny} {
			for plen := 16; plen >= 0; plen-- {
				mask := uint16(0)
				if plen > 0 {
					mask = ^uint16(0) << (16 - plen)
				}
				k := RuleKey{Subject: subject, Peer: pe, Direction: dir, Proto: pr, Port: port & mask, PortPrefix: uint8(plen)}
				if v, ok := c.Rules[k]; ok {
					return v, true
				}
			}
		}
	}
	return RuleValue{}, false
}

// Verdict explains a decision of Allowed.
type Verdict struct {
	Allowed bool
	// Ingress/Egress: the policy that allowed that direction, or the first
	// policy isolating the endpoint when it denied; "" when the direction is
	// not isolated (or the side is not an endpoint).
	Ingress string
	Egress  string
	// Reason is a short human-readable explanation.
	Reason string
}

// Allowed evaluates, over the compiled form only, whether a new connection
// from src to dst:port over proto (ProtoTCP or ProtoUDP) is allowed: the
// source endpoint's egress and the destination endpoint's ingress must both
// allow it (a non-endpoint side imposes nothing).
func (c *Compiled) Allowed(src, dst netip.Addr, proto uint8, port uint16) Verdict {
	sid, sEP := c.IdentityOf(src)
	did, dEP := c.IdentityOf(dst)
	v := Verdict{Allowed: true}
	if sEP {
		if iso := c.Isolated[sid]; iso.PolicyEgress != 0 {
			if r, ok := c.LookupPeer(sid, Egress, dst, proto, port); ok {
				v.Egress = c.Policies[r.Policy].String()
			} else {
				v.Allowed = false
				v.Egress = c.Policies[iso.PolicyEgress-1].String()
				v.Reason = fmt.Sprintf("egress of identity %d denied (isolated by %s)", sid, v.Egress)
			}
		}
	}
	if dEP {
		if iso := c.Isolated[did]; iso.PolicyIngress != 0 {
			if r, ok := c.LookupPeer(did, Ingress, src, proto, port); ok {
				v.Ingress = c.Policies[r.Policy].String()
			} else {
				v.Allowed = false
				v.Ingress = c.Policies[iso.PolicyIngress-1].String()
				if v.Reason != "" {
					v.Reason += "; "
				}
				v.Reason += fmt.Sprintf("ingress of identity %d denied (isolated by %s)", did, v.Ingress)
			}
		}
	}
	if v.Allowed {
		v.Reason = "allowed"
	}
	return v
}
