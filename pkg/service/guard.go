package service

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// Addresses a Pod or Service names that this node refuses to serve: each
// would let whoever may create the object capture the node's connections to
// an address that is not theirs, because a frontend is matched before
// routing for every packet the node's pods and processes send.

// Reasons an address is ignored.
const (
	// ReasonHostIPNotNode: a hostPort's hostIP is not an address of this node.
	ReasonHostIPNotNode = "hostip-not-node"
	// ReasonExternalIPNotAllowed: a spec.externalIPs address outside
	// Options.ExternalIPs (CVE-2020-8554).
	ReasonExternalIPNotAllowed = "externalip-not-allowed"
	// ReasonProtocolUnsupported: a Service or hostPort port of a protocol
	// lanekit does not load-balance (SCTP); the object's other ports are
	// served.
	ReasonProtocolUnsupported = "protocol-unsupported"
)

// Ignored is one address (and, for a hostPort, port and protocol) the
// translation left out on purpose.
type Ignored struct {
	Addr   netip.Addr
	Port   uint16 // 0: every port of the object
	Proto  Proto  // with Port
	Reason string
}

func (g Ignored) String() string {
	switch {
	case g.Port == 0:
		return g.Addr.String()
	case !g.Addr.IsValid(): // a port of every address (a Service port, a hostPort without hostIP)
		return fmt.Sprintf("%d/%s", g.Port, g.Proto)
	}
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(g.Addr, g.Port), g.Proto)
}

// IsNodeAddr says whether a is this node's own address, one a hostPort may
// name as hostIP: one of HostAddrs or NodeAddrs, or the loopback 127.0.0.1
// or ::1 (the node's processes on loopback).
func (o Options) IsNodeAddr(a netip.Addr) bool {
	return a == netip.AddrFrom4([4]byte{127, 0, 0, 1}) || a == netip.IPv6Loopback() ||
		slices.Contains(o.HostAddrs, a) || slices.Contains(o.NodeAddrs, a)
}

// ExternalIPPolicy says which spec.externalIPs addresses a node serves. Any
// user who may create a Service may set spec.externalIPs to any address and
// capture the cluster's connections to it (CVE-2020-8554); Kubernetes leaves
// the guard to the cluster (the DenyServiceExternalIPs admission plugin, an
// admission webhook) or to the service proxy. The zero value serves all, as
// kube-proxy and Cilium do.
type ExternalIPPolicy struct {
	// Restrict: only addresses in Allow are served (Allow empty: none).
	Restrict bool
	Allow    []netip.Prefix
}

// ParseExternalIPPolicy parses the agent's --external-ips value: "all",
// "none", or a comma-separated list of CIDRs (an address alone is its /32 or
// /128) the served externalIPs must be in.
func ParseExternalIPPolicy(s string) (ExternalIPPolicy, error) {
	switch s = strings.TrimSpace(s); s {
	case "all":
		return ExternalIPPolicy{}, nil
	case "none":
		return ExternalIPPolicy{Restrict: true}, nil
	case "":
		return ExternalIPPolicy{}, fmt.Errorf("want all, none or a list of CIDRs, got an empty value")
	}
	p := ExternalIPPolicy{Restrict: true}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		pfx, err := netip.ParsePrefix(f)
		if err != nil {
			a, aerr := netip.ParseAddr(f)
			if aerr != nil {
				return ExternalIPPolicy{}, fmt.Errorf("want all, none or a list of CIDRs: %q is neither a CIDR nor an address", f)
			}
			pfx = netip.PrefixFrom(a, a.BitLen())
		}
		if pfx.Addr().Is4In6() || pfx != pfx.Masked() {
			return ExternalIPPolicy{}, fmt.Errorf("CIDR %q: want a network address (%s) and no IPv4-mapped IPv6", f, pfx.Masked())
		}
		p.Allow = append(p.Allow, pfx)
	}
	return p, nil
}

// Allows says whether the policy serves external address a.
func (p ExternalIPPolicy) Allows(a netip.Addr) bool {
	return !p.Restrict || slices.ContainsFunc(p.Allow, func(pfx netip.Prefix) bool { return pfx.Contains(a) })
}

func (p ExternalIPPolicy) String() string {
	switch {
	case !p.Restrict:
		return "all"
	case len(p.Allow) == 0:
		return "none"
	}
	s := make([]string, len(p.Allow))
	for i, pfx := range p.Allow {
		s[i] = pfx.String()
	}
	return strings.Join(s, ",")
}

// ServiceIgnored returns what of a Service gets no frontend on purpose: its
// spec.externalIPs outside opts.ExternalIPs and its ports of a protocol
// lanekit does not load-balance (SCTP).
func ServiceIgnored(svc *k8sobj.Service, opts Options) []Ignored {
	out := ExternalIPsIgnored(svc, opts)
	if !servedByUs(svc) {
		return out
	}
	for _, sp := range svc.Spec.Ports {
		if proto := protoOf(&sp.Protocol); !proto.served() {
			out = append(out, Ignored{Port: uint16(sp.Port), Proto: proto, Reason: ReasonProtocolUnsupported})
		}
	}
	return out
}

// servedByUs says whether lanekit gives the Service frontends at all (not
// ExternalName, headless or another proxy's).
func servedByUs(svc *k8sobj.Service) bool {
	_, otherProxy := svc.Labels[ServiceProxyNameLabel]
	_, headless := svc.Labels[HeadlessLabel]
	return svc.Spec.Type != corev1.ServiceTypeExternalName && svc.Spec.ClusterIP != corev1.ClusterIPNone && !otherProxy && !headless
}

// ExternalIPsIgnored returns the spec.externalIPs of a Service that
// opts.ExternalIPs does not serve (none for a Service that gets no frontend
// at all: ExternalName, headless, another proxy's).
func ExternalIPsIgnored(svc *k8sobj.Service, opts Options) []Ignored {
	if !servedByUs(svc) {
		return nil
	}
	var out []Ignored
	for _, s := range svc.Spec.ExternalIPs {
		if a, err := netip.ParseAddr(s); err == nil && !opts.ExternalIPs.Allows(a) &&
			!slices.ContainsFunc(out, func(g Ignored) bool { return g.Addr == a }) {
			out = append(out, Ignored{Addr: a, Reason: ReasonExternalIPNotAllowed})
		}
	}
	return out
}
