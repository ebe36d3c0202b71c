package service

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// loadBalancerSourceRanges (k8sobj.LoadBalancerSourceRanges) as kube-proxy
// applies them: to the Service's LoadBalancer ingress IPs (ipMode VIP),
// not to its cluster IPs, NodePorts or externalIPs; per address family (an
// ingress IP is limited by the ranges of its family; with none of its
// family, or with a zero-length one such as 0.0.0.0/0, it is open); for
// every client, pods and the node's processes too. The datapath drops
// packets from other sources (bpf/lib/lb.h, DROP_LB_SRC_RANGE).

// lbVIPs returns the LoadBalancer ingress IPs of svc the node serves (not
// ipMode Proxy; ExternalAddrs).
func lbVIPs(svc *k8sobj.Service) []netip.Addr {
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return nil
	}
	var out []netip.Addr
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if in.IPMode != nil && *in.IPMode == corev1.LoadBalancerIPModeProxy {
			continue
		}
		if a, err := netip.ParseAddr(in.IP); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// sourceRangesFor returns the source prefixes frontend address a admits,
// sorted, or nil (every source): nil unless a is a LoadBalancer ingress IP
// (vips). When a range holds one of the node's addresses, a itself is
// admitted too, as kube-proxy's allowFromNode: the node's own connections
// to an ingress IP may carry it as their source, and the socket load
// balancer (bpf/lib/sock.h) asks with it for the node's processes.
func sourceRangesFor(a netip.Addr, vips []netip.Addr, ranges []netip.Prefix, opts Options) []netip.Prefix {
	if !slices.Contains(vips, a) {
		return nil
	}
	var out []netip.Prefix
	node := false
	for _, p := range ranges {
		if p.Addr().Is4() != a.Is4() {
			continue
		}
		if p.Bits() == 0 {
			return nil // all of the family: open, as an empty list
		}
		out = append(out, p)
		node = node || slices.ContainsFunc(opts.NodeAddrs, p.Contains)
	}
	if node {
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	slices.SortFunc(out, comparePrefix)
	return slices.Compact(out)
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// SrcRangeKey keys the source-range LPM trie (C: struct lb_src_range_key):
// one admitted source prefix of a frontend. IPv4 prefixes are stored
// IPv4-mapped (::ffff:a.b.c.d, 96 more bits), so one map serves both
// families; Prefixlen counts FrontendID's 32 bits too.
type SrcRangeKey struct {
	Prefixlen  uint32
	FrontendID uint32
	Addr       [16]byte
}

// SrcRangeKeyOf returns the key of prefix p of frontend id.
func SrcRangeKeyOf(id uint32, p netip.Prefix) SrcRangeKey {
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	return SrcRangeKey{Prefixlen: 32 + uint32(bits), FrontendID: id, Addr: p.Masked().Addr().As16()}
}

// Prefix returns the source prefix k holds; ok is false for a key no
// SrcRangeKeyOf makes (a corrupt entry).
func (k SrcRangeKey) Prefix() (netip.Prefix, bool) {
	if k.Prefixlen < 32 || k.Prefixlen > 32+128 {
		return netip.Prefix{}, false
	}
	a, bits := netip.AddrFrom16(k.Addr), int(k.Prefixlen-32)
	if a.Is4In6() {
		if bits < 96 {
			return netip.Prefix{}, false
		}
		a, bits = a.Unmap(), bits-96
	}
	p := netip.PrefixFrom(a, bits)
	return p, p.IsValid() && p.Masked() == p
}

// putSrcRanges records the source-range changes of frontend id from have
// to want (both sorted) in u.
func putSrcRanges(u *Update, id uint32, have, want []netip.Prefix) {
	for _, p := range want {
		if _, found := slices.BinarySearchFunc(have, p, comparePrefix); !found {
			u.SrcRanges = append(u.SrcRanges, SrcRangeKeyOf(id, p))
		}
	}
	for _, p := range have {
		if _, found := slices.BinarySearchFunc(want, p, comparePrefix); !found {
			u.SrcRangeDeletes = append(u.SrcRangeDeletes, SrcRangeKeyOf(id, p))
		}
	}
}

// adoptSrcRanges records the source ranges the datapath holds (u.SrcRanges)
// on the adopted frontends (byFront); those of no adopted frontend, or
// corrupt, go to orphans' deletes.
func adoptSrcRanges(u *Update, byFront map[uint32]*programmed, orphans *Update) {
	for _, k := range u.SrcRanges {
		p, ok := k.Prefix()
		f := byFront[k.FrontendID]
		if !ok || f == nil {
			orphans.SrcRangeDeletes = append(orphans.SrcRangeDeletes, k)
			continue
		}
		f.ranges = append(f.ranges, p)
	}
	for _, f := range byFront {
		slices.SortFunc(f.ranges, comparePrefix)
		f.ranges = slices.Compact(f.ranges)
	}
}
