// Package service translates Kubernetes Services and their EndpointSlices into a
// datapath-neutral load-balancing model (frontends → backends with Maglev tables)
// and, through Tables, into map-shaped key/value updates a BPF datapath loads.
//
// The same translation serves `lanekit service apply -f` files (objects from
// k8sobj.Decode) and the API-server watchers (objects from informers):
//
//	m := service.NewModel(opts)
//	m2, _ := m.With(svc, slices)       // or Build(services, slices, opts)
//	upd := tables.Apply(service.Diff(m, m2))
//	// load upd into the maps (order: Update doc), then m = m2
package service

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// Proto is an IP protocol number.
type Proto uint8

// Protocols of Service and hostPort ports. lanekit load-balances TCP and
// UDP; SCTP ports are kept in the model (an object listing one is not
// refused) but get no frontend (served; ServiceIgnored and HostPortsIgnored
// report them).
const (
	TCP  Proto = 6
	UDP  Proto = 17
	SCTP Proto = 132
)

func (p Proto) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	case SCTP:
		return "SCTP"
	}
	return "proto-" + strconv.Itoa(int(p))
}

// protoOf is the protocol of a Kubernetes port ("" and nil are TCP);
// validation refuses other protocols, which get 0 (no frontend).
func protoOf(p *corev1.Protocol) Proto {
	if p == nil {
		return TCP
	}
	switch *p {
	case "", corev1.ProtocolTCP:
		return TCP
	case corev1.ProtocolUDP:
		return UDP
	case corev1.ProtocolSCTP:
		return SCTP
	}
	return 0
}

// served says whether lanekit load-balances proto. It is the one place an
// SCTP frontend is turned away: SCTP keeps its protocol number through
// translation, so serving it (on a kernel with SCTP: CONFIG_IP_SCTP, probed
// by opening an AF_INET SOCK_STREAM IPPROTO_SCTP socket) means admitting it
// here behind that probe, and a datapath whose LB keys, conntrack (ct.h
// already tracks SCTP by its ports for policy) and NAT take protocol 132:
// an address-only DNAT needs no checksum fix (SCTP's CRC32c does not cover
// the IP header), a port translation must recompute the CRC32c, and the
// socket LB's connect hooks see SCTP sockets too.
func (p Proto) served() bool { return p == TCP || p == UDP }

// Scope tells how a frontend is reached.
type Scope uint8

const (
	// ScopeClusterIP: the Service's cluster IP and port.
	ScopeClusterIP Scope = 0
	// ScopeNodePort: a node address and the Service's node port.
	ScopeNodePort Scope = 1
)

// ServiceID names a Service.
type ServiceID struct{ Namespace, Name string }

func (id ServiceID) String() string { return id.Namespace + "/" + id.Name }

// FrontendKey is what a client connects to.
type FrontendKey struct {
	Addr  netip.Addr
	Port  uint16
	Proto Proto
	Scope Scope
}

func (k FrontendKey) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(k.Addr, k.Port), k.Proto)
}

// BackendState says whether a backend takes new flows.
type BackendState uint8

const (
	// BackendActive: ready; takes new flows.
	BackendActive BackendState = 0
	// BackendTerminating: serving but terminating; no new flows (unless the
	// frontend has no active backend, as kube-proxy does), existing flows stay.
	BackendTerminating BackendState = 1
	// BackendNotReady: listed but neither ready nor serving; no new flows,
	// existing flows stay.
	BackendNotReady BackendState = 2
)

func (s BackendState) String() string {
	return [...]string{"active", "terminating", "not-ready"}[s]
}

// Backend is one endpoint of a frontend, with the target port resolved.
type Backend struct {
	Addr  netip.Addr
	Port  uint16
	State BackendState
}

// Key is the backend's identity for Maglev: "addr:port/proto" of the frontend.
func (b Backend) key(p Proto) string {
	return netip.AddrPortFrom(b.Addr, b.Port).String() + "/" + p.String()
}

// Frontend is one translated frontend with everything the datapath needs.
// Frontends are immutable once built; models share them.
type Frontend struct {
	Key      FrontendKey
	Service  ServiceID
	PortName string
	// Backends: every known backend, sorted by address and port.
	Backends []Backend
	// AffinityTimeout is the ClientIP session affinity timeout; 0 = none.
	AffinityTimeout time.Duration
	// Maglev holds, per slot, an index into Backends; None when no backend
	// takes new flows (the datapath then answers ICMP unreachable / TCP
	// reset).
	Maglev MaglevTable
	// Local: a traffic policy Local frontend whose Service has endpoints
	// somewhere. Backends are this node's only; without one the datapath
	// drops new flows silently (no-local-backend), as kube-proxy does. A
	// Local-policy frontend of a Service with no endpoint at all is not
	// Local: it answers like any frontend without backends.
	Local bool
	// External: an external address (spec.externalIPs, a LoadBalancer
	// ingress IP), not a node address: source NAT to a remote backend uses
	// the node's own address.
	External bool
	// SourceRanges: a LoadBalancer ingress IP's loadBalancerSourceRanges
	// of its family (srcrange.go), sorted; only these sources reach it. Nil:
	// every source.
	SourceRanges []netip.Prefix
}

// Eligible returns how many distinct backends appear in the Maglev table.
func (f *Frontend) Eligible() int {
	n := 0
	for _, b := range f.Backends {
		if b.State == f.eligibleState() {
			n++
		}
	}
	if f.Maglev.None() {
		return 0
	}
	return n
}

func (f *Frontend) eligibleState() BackendState {
	for _, b := range f.Backends {
		if b.State == BackendActive {
			return BackendActive
		}
	}
	return BackendTerminating
}

// Options are the node-local inputs of the translation.
type Options struct {
	// NodeAddrs are this node's addresses that NodePort frontends listen on.
	NodeAddrs []netip.Addr
	// LocalPrefixes hold this node's endpoints (its pod CIDR): with
	// NodeAddrs (hostNetwork endpoints), what traffic policy Local keeps.
	LocalPrefixes []netip.Prefix
	// NodeName and Zone (the Node's topology.kubernetes.io/zone) match the
	// EndpointSlice hints (trafficDistribution); empty: no hint matches.
	NodeName, Zone string
	// HostAddrs are every address of every interface of the node (both
	// families): with NodeAddrs and loopback, the hostIPs a hostPort may
	// name (IsNodeAddr).
	HostAddrs []netip.Addr
	// ExternalIPs says which spec.externalIPs are served (the zero value:
	// all of them).
	ExternalIPs ExternalIPPolicy
}

// IsLocal says whether an endpoint address is on this node: in one of
// LocalPrefixes, or one of NodeAddrs.
func (o Options) IsLocal(a netip.Addr) bool {
	for _, p := range o.LocalPrefixes {
		if p.Contains(a) {
			return true
		}
	}
	return slices.Contains(o.NodeAddrs, a)
}

// ExternalAddrs are the external addresses of a Service this node serves:
// spec.externalIPs that opts.ExternalIPs allows (ExternalIPsIgnored returns
// the others), then the LoadBalancer ingress IPs of a LoadBalancer Service,
// without duplicates. An ingress IP whose ipMode is Proxy is not the node's
// to serve: the load balancer proxies to the NodePort (as kube-proxy leaves
// it alone).
func ExternalAddrs(svc *k8sobj.Service, opts Options) []netip.Addr {
	var out []netip.Addr
	add := func(s string) {
		if a, err := netip.ParseAddr(s); err == nil && !a.Is4In6() && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	for _, a := range svc.Spec.ExternalIPs {
		if ip, err := netip.ParseAddr(a); err == nil && opts.ExternalIPs.Allows(ip) {
			add(a)
		}
	}
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if in.IPMode != nil && *in.IPMode == corev1.LoadBalancerIPModeProxy {
				continue
			}
			add(in.IP)
		}
	}
	return out
}

// ServiceProxyNameLabel names the service proxy a Service is for: one with
// the label is not the default proxy's (kube-proxy's, here lanekit's).
const ServiceProxyNameLabel = "service.kubernetes.io/service-proxy-name"

// HeadlessLabel marks Services and EndpointSlices no proxy programs (the
// EndpointSlice controller sets it on a headless Service's slices; kube-proxy
// watches both kinds with the label excluded, and so does lanekit).
const HeadlessLabel = corev1.IsHeadlessService

// Translate turns one Service and its EndpointSlices (those labelled
// kubernetes.io/service-name=<name> in its namespace; others are ignored) into
// frontends, sorted by key. Inputs are expected to have passed k8sobj.Validate;
// Translate validates them again and returns an error naming the object.
func Translate(svc *k8sobj.Service, eps []*k8sobj.EndpointSlice, opts Options) ([]*Frontend, error) {
	if err := k8sobj.Validate(k8sobj.Object{Kind: k8sobj.KindService, Service: svc}); err != nil {
		return nil, fmt.Errorf("service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	id := ServiceID{svc.Namespace, svc.Name}
	var mine []*k8sobj.EndpointSlice
	for _, es := range eps {
		if !ownSlice(svc, es) {
			continue
		}
		if err := k8sobj.Validate(k8sobj.Object{Kind: k8sobj.KindEndpointSlice, EndpointSlice: es}); err != nil {
			return nil, fmt.Errorf("endpointslice %s/%s: %w", es.Namespace, es.Name, err)
		}
		mine = append(mine, es)
	}
	if svc.Spec.Type == corev1.ServiceTypeExternalName || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return nil, nil // a DNS alias, or headless: no virtual IP
	}
	if _, ok := svc.Labels[ServiceProxyNameLabel]; ok {
		return nil, nil // another service proxy's, as kube-proxy leaves it
	}
	if _, ok := svc.Labels[HeadlessLabel]; ok {
		return nil, nil // labelled headless: kube-proxy does not watch it
	}
	clusterIPs := ClusterIPs(svc)
	var affinity time.Duration
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		secs := int32(k8sobj.DefaultAffinityTimeoutSeconds)
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			secs = *c.ClientIP.TimeoutSeconds
		}
		affinity = time.Duration(secs) * time.Second
	}
	itpLocal := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	etpLocal := svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	external := ExternalAddrs(svc, opts)
	vips := lbVIPs(svc)
	ranges, _ := k8sobj.LoadBalancerSourceRanges(svc) // validated above
	var out []*Frontend
	for _, sp := range svc.Spec.Ports {
		proto := protoOf(&sp.Protocol)
		if !proto.served() {
			continue // SCTPPortsIgnored reports it; the other ports are served
		}
		all, hints := resolveBackends(sp.Name, proto, mine)
		// One frontend per cluster IP (dual-stack: one of each family),
		// each with the endpoints of its family.
		for _, vip := range clusterIPs {
			fam := sameFamily(all, vip)
			// Cluster-wide frontends follow the EndpointSlice topology hints.
			backends := topologyFilter(fam, hints, opts)
			table := maglevFor(backends, proto)
			// Traffic policy Local: this node's endpoints only (computed once
			// per port, shared by its Local frontends).
			var local *Frontend
			localView := func() *Frontend {
				if local == nil {
					lb := slices.DeleteFunc(slices.Clone(fam), func(b Backend) bool { return !opts.IsLocal(b.Addr) })
					local = &Frontend{Backends: lb, Maglev: maglevFor(lb, proto), Local: !table.None()}
				}
				return local
			}
			mk := func(key FrontendKey, policyLocal, ext bool) *Frontend {
				f := &Frontend{Key: key, Service: id, PortName: sp.Name, Backends: backends,
					AffinityTimeout: affinity, Maglev: table, External: ext}
				if policyLocal {
					l := localView()
					f.Backends, f.Maglev, f.Local = l.Backends, l.Maglev, l.Local
				}
				return f
			}
			// ext adds a frontend reached from outside (NodePort scope: what
			// arrives on the uplink) and, with externalTrafficPolicy Local, its
			// cluster-wide twin for pods and the node's processes (ClusterIP
			// scope on the same address and port, looked up first by both).
			// Both take the address's source ranges (a LoadBalancer ingress
			// IP's; none for the others).
			ext := func(addr netip.Addr, port uint16, isExt bool) {
				src := sourceRangesFor(addr, vips, ranges, opts)
				f := mk(FrontendKey{Addr: addr, Port: port, Proto: proto, Scope: ScopeNodePort}, etpLocal, isExt)
				f.SourceRanges = src
				out = append(out, f)
				if etpLocal {
					f = mk(FrontendKey{Addr: addr, Port: port, Proto: proto, Scope: ScopeClusterIP}, false, isExt)
					f.SourceRanges = src
					out = append(out, f)
				}
			}
			out = append(out, mk(FrontendKey{Addr: vip, Port: uint16(sp.Port), Proto: proto, Scope: ScopeClusterIP}, itpLocal, false))
			// NodePorts on the node's addresses and the external addresses
			// of the cluster IP's family (a dual-stack Service: both).
			if sp.NodePort != 0 {
				for _, a := range opts.NodeAddrs {
					if a.Is4() == vip.Is4() {
						ext(a, uint16(sp.NodePort), false)
					}
				}
			}
			for _, a := range external {
				if a.Is4() == vip.Is4() {
					ext(a, uint16(sp.Port), true)
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b *Frontend) int { return compareKeys(a.Key, b.Key) })
	return out, nil
}

// ClusterIPs returns a Service's cluster IPs: spec.clusterIPs (a dual-stack
// Service has one of each family), else spec.clusterIP. Validated input.
func ClusterIPs(svc *k8sobj.Service) []netip.Addr {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 {
		ips = []string{svc.Spec.ClusterIP}
	}
	out := make([]netip.Addr, 0, len(ips))
	for _, s := range ips {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// sameFamily returns the backends of vip's address family: bs itself when
// every one is (a single-stack Service's; the frontends share it and never
// write to it), else a copy without the other family's.
func sameFamily(bs []Backend, vip netip.Addr) []Backend {
	other := func(b Backend) bool { return b.Addr.Is4() != vip.Is4() }
	if !slices.ContainsFunc(bs, other) {
		return bs
	}
	return slices.DeleteFunc(slices.Clone(bs), other)
}

func compareKeys(a, b FrontendKey) int {
	return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Scope, b.Scope))
}

// maglevFor builds the Maglev table over the backends that take new flows: the
// active ones, or — when none is active — the serving terminating ones.
func maglevFor(backends []Backend, proto Proto) MaglevTable {
	want := BackendActive
	if !slices.ContainsFunc(backends, func(b Backend) bool { return b.State == BackendActive }) {
		want = BackendTerminating
	}
	var keys []string
	var idx []int32
	for i, b := range backends {
		if b.State == want {
			keys = append(keys, b.key(proto))
			idx = append(idx, int32(i))
		}
	}
	t := Maglev(keys, MaglevSize(len(keys)))
	for i, k := range t {
		t[i] = idx[k]
	}
	return packMaglev(t, len(backends))
}

// Model is the translated state of all services: an immutable snapshot. With
// and Without return new snapshots that share unchanged frontends, so Diff
// between them costs one pointer compare per unchanged frontend.
type Model struct {
	opts      Options
	frontends map[FrontendKey]*Frontend
	byService map[ServiceID][]FrontendKey
}

// NewModel returns an empty model for a node.
func NewModel(opts Options) *Model {
	return &Model{opts: opts, frontends: map[FrontendKey]*Frontend{}, byService: map[ServiceID][]FrontendKey{}}
}

// Build translates all services with their slices into a model. Slices of
// services not in svcs are ignored.
func Build(svcs []*k8sobj.Service, eps []*k8sobj.EndpointSlice, opts Options) (*Model, error) {
	bySvc := map[ServiceID][]*k8sobj.EndpointSlice{}
	for _, es := range eps {
		id := ServiceID{es.Namespace, es.ServiceName}
		bySvc[id] = append(bySvc[id], es)
	}
	// Translation is per service and independent: spread it over the CPUs,
	// then insert in input order (errors and clashes are reported as a
	// sequential build would).
	type result struct {
		fes []*Frontend
		err error
	}
	res := make([]result, len(svcs))
	var wg sync.WaitGroup
	workers := min(runtime.GOMAXPROCS(0), max(1, len(svcs)/64))
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(svcs); i += workers {
				s := svcs[i]
				res[i].fes, res[i].err = Translate(s, bySvc[ServiceID{s.Namespace, s.Name}], opts)
			}
		})
	}
	wg.Wait()
	m := NewModel(opts)
	for i, s := range svcs {
		id := ServiceID{s.Namespace, s.Name}
		if _, dup := m.byService[id]; dup {
			return nil, fmt.Errorf("service %s: duplicate", id)
		}
		if res[i].err != nil {
			return nil, res[i].err
		}
		if err := m.insert(id, res[i].fes); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Model) insert(id ServiceID, fes []*Frontend) error {
	keys := make([]FrontendKey, 0, len(fes))
	for _, f := range fes {
		if other, taken := m.frontends[f.Key]; taken && other.Service != id {
			return fmt.Errorf("service %s: frontend %s already belongs to service %s", id, f.Key, other.Service)
		}
	}
	for _, f := range fes {
		m.frontends[f.Key] = f
		keys = append(keys, f.Key)
	}
	m.byService[id] = keys
	return nil
}

func (m *Model) clone() *Model {
	return &Model{opts: m.opts, frontends: maps.Clone(m.frontends), byService: maps.Clone(m.byService)}
}

// With returns a model where svc (with its slices) replaces any earlier version
// of that service. The receiver is unchanged.
func (m *Model) With(svc *k8sobj.Service, eps []*k8sobj.EndpointSlice) (*Model, error) {
	fes, err := Translate(svc, eps, m.opts)
	if err != nil {
		return nil, err
	}
	id := ServiceID{svc.Namespace, svc.Name}
	n := m.clone()
	n.remove(id)
	if err := n.insert(id, fes); err != nil {
		return nil, err
	}
	return n, nil
}

// Set replaces the service in place (the agent's incremental path) and returns
// only that service's changes; the cost does not depend on how many other
// services the model holds. On error the model is unchanged.
func (m *Model) Set(svc *k8sobj.Service, eps []*k8sobj.EndpointSlice) (Changes, error) {
	fes, err := Translate(svc, eps, m.opts)
	if err != nil {
		return Changes{}, err
	}
	id := ServiceID{svc.Namespace, svc.Name}
	for _, f := range fes {
		if other, taken := m.frontends[f.Key]; taken && other.Service != id {
			return Changes{}, fmt.Errorf("service %s: frontend %s already belongs to service %s", id, f.Key, other.Service)
		}
	}
	old := map[FrontendKey]*Frontend{}
	for _, k := range m.byService[id] {
		old[k] = m.frontends[k]
	}
	m.remove(id)
	if err := m.insert(id, fes); err != nil {
		return Changes{}, err // unreachable: checked above
	}
	var c Changes
	for _, f := range fes {
		if o, ok := old[f.Key]; !ok || !equalFrontend(o, f) {
			c.Upserted = append(c.Upserted, f)
		}
		delete(old, f.Key)
	}
	for k := range old {
		c.Removed = append(c.Removed, k)
	}
	slices.SortFunc(c.Removed, compareKeys)
	return c, nil
}

// Delete removes the service in place and returns its removed frontends.
func (m *Model) Delete(id ServiceID) Changes {
	c := Changes{Removed: slices.Clone(m.byService[id])}
	m.remove(id)
	return c
}

// Without returns a model without the service id.
func (m *Model) Without(id ServiceID) *Model {
	n := m.clone()
	n.remove(id)
	return n
}

func (m *Model) remove(id ServiceID) {
	for _, k := range m.byService[id] {
		delete(m.frontends, k)
	}
	delete(m.byService, id)
}

// Shadowed returns the hostPort frontends of pod that the model does not
// hold for it (another service has the address, port and protocol).
func (m *Model) Shadowed(pod *k8sobj.Pod) []FrontendKey {
	var out []FrontendKey
	for _, f := range HostPortFrontends(pod, m.opts) {
		if h := m.frontends[f.Key]; h == nil || h.Service != f.Service {
			out = append(out, f.Key)
		}
	}
	return out
}

// Frontend returns the frontend for key, or nil.
func (m *Model) Frontend(key FrontendKey) *Frontend { return m.frontends[key] }

// Frontends returns all frontends sorted by key.
func (m *Model) Frontends() []*Frontend {
	out := slices.Collect(maps.Values(m.frontends))
	slices.SortFunc(out, func(a, b *Frontend) int { return compareKeys(a.Key, b.Key) })
	return out
}

// Services returns the IDs of all services, sorted.
func (m *Model) Services() []ServiceID {
	out := slices.Collect(maps.Keys(m.byService))
	slices.SortFunc(out, func(a, b ServiceID) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// Select returns the backend a new flow with the given hash takes, as the
// datapath does: Maglev[hash % len]. ok is false when no backend takes new flows.
func (f *Frontend) Select(hash uint32) (Backend, bool) {
	if f.Maglev.None() {
		return Backend{}, false
	}
	return f.Backends[f.Maglev.At(int(hash%uint32(f.Maglev.Len())))], true
}

// Edit is one service's new version in a Batch; a nil Service removes ID.
// For a pod's hostPorts (ID is HostPortID(Pod)) Pod is set instead of Service;
// both nil removes ID.
type Edit struct {
	ID      ServiceID
	Service *k8sobj.Service
	Slices  []*k8sobj.EndpointSlice
	Pod     *k8sobj.Pod
}

// Batch applies edits to the model in place, all or nothing: on error the
// model is as it was. It returns the edited services' changes and an undo
// that restores the model as it was before the batch (for a caller whose
// later step fails). Its cost depends on the edited services only, not on
// how many the model holds (With/Without copy the model per call). A
// re-translated frontend equal to the one it replaces is not kept: the
// model keeps the old one, which the tables hold (as Diff).
func (m *Model) Batch(edits []Edit) (Changes, func(), error) {
	type saved struct {
		keys    []FrontendKey
		fes     []*Frontend
		present bool
	}
	old := make(map[ServiceID]saved, len(edits))
	for _, e := range edits {
		if _, seen := old[e.ID]; seen {
			continue
		}
		var s saved
		if keys, ok := m.byService[e.ID]; ok {
			s = saved{keys: keys, present: true}
			for _, k := range keys {
				s.fes = append(s.fes, m.frontends[k])
			}
		}
		old[e.ID] = s
	}
	undo := func() {
		for id := range old {
			m.remove(id)
		}
		for id, s := range old {
			if !s.present {
				continue
			}
			for i, k := range s.keys {
				m.frontends[k] = s.fes[i]
			}
			m.byService[id] = s.keys
		}
	}
	for _, e := range edits {
		var fes []*Frontend
		switch {
		case e.Pod != nil:
			if HostPortID(e.Pod) != e.ID {
				undo()
				return Changes{}, nil, fmt.Errorf("pod %s/%s: hostPort edit for %s", e.Pod.Namespace, e.Pod.Name, e.ID)
			}
			// A frontend a Service (or another pod) holds stays theirs:
			// the hostPort is shadowed, not an error (Shadowed tells).
			fes = slices.DeleteFunc(HostPortFrontends(e.Pod, m.opts), func(f *Frontend) bool {
				other, taken := m.frontends[f.Key]
				return taken && other.Service != e.ID
			})
			if len(fes) == 0 {
				m.remove(e.ID)
				continue
			}
		case e.Service == nil:
			m.remove(e.ID)
			continue
		case (ServiceID{e.Service.Namespace, e.Service.Name}) != e.ID:
			undo()
			return Changes{}, nil, fmt.Errorf("service %s: edit for %s", ServiceID{e.Service.Namespace, e.Service.Name}, e.ID)
		default:
			var err error
			if fes, err = Translate(e.Service, e.Slices, m.opts); err != nil {
				undo()
				return Changes{}, nil, err
			}
		}
		m.remove(e.ID)
		if err := m.insert(e.ID, fes); err != nil {
			undo()
			return Changes{}, nil, err
		}
	}
	var c Changes
	for id, s := range old {
		prev := make(map[FrontendKey]*Frontend, len(s.keys))
		for i, k := range s.keys {
			prev[k] = s.fes[i]
		}
		for _, k := range m.byService[id] {
			f := m.frontends[k]
			o, ok := prev[k]
			switch {
			case !ok || (o != f && !equalFrontend(o, f)):
				c.Upserted = append(c.Upserted, f)
			case o != f:
				m.frontends[k] = o
			}
			delete(prev, k)
		}
		for k := range prev {
			// A frontend another edited service took over is that service's upsert.
			if _, taken := m.frontends[k]; !taken {
				c.Removed = append(c.Removed, k)
			}
		}
	}
	slices.SortFunc(c.Upserted, func(a, b *Frontend) int { return compareKeys(a.Key, b.Key) })
	slices.SortFunc(c.Removed, compareKeys)
	return c, undo, nil
}
