package k8s

// Moved VM addresses (issue 27 item 2, Kubernetes side): every agent derives
// the nodes' claims of VM addresses from the VMIs it already watches, with
// no write RBAC and no object of its own. A VMI's migrationState says which
// node runs the VM: the target once the migration completed, else the
// source (a migration in progress or failed leaves the VM where it was);
// its time orders claims (the end of a completed migration, else its
// start), and status.interfaces carries the addresses of the lanekit
// interfaces. Each claim of another node is routed to that node's
// InternalIP (agent.SyncEndpointRoutes, which also takes the local VM out
// when a later claim elsewhere supersedes it): a /32 route via it in native
// routing, a /32 node map entry with it as the underlay address in tunnel
// mode (the InternalIP is the underlay the node map has for the owner's pod
// CIDR: nodeInternalIPv4 serves both); the owner itself gets neither. A VMI that never migrated claims nothing: its address is in the
// pod CIDR of its node. A deleted VMI's claims go with it.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/kubevirt"
)

// EndpointRouteSink takes the full set of other nodes' claims of moved VM
// addresses.
type EndpointRouteSink interface {
	SyncEndpointRoutes(routes []agent.EndpointRoute) (installed int, superseded []string, err error)
}

var _ EndpointRouteSink = (*agent.Agent)(nil)

// claimsRetry is how soon a failed sync is tried again without a change.
const claimsRetry = 5 * time.Second

// vmiClaims are the claims of one VMI's lanekit addresses: nil when it
// never migrated or the owner is unknown; the owner node too (also when
// it is self, whose claims the caller leaves out).
//
// The addresses are those status.interfaces reports for the lanekit
// interfaces that the owner's launcher pod (the migration's target pod once
// it completed, else its source pod) was given by lanekit and that no other
// pod holds (vmitrust.go); pods is the source's Pods.
func vmiClaims(u *unstructured.Unstructured, pods podCache) (owner string, claims []agent.EndpointRoute, err error) {
	raw, err := json.Marshal(u.Object)
	if err != nil {
		return "", nil, err
	}
	kv, err := kubevirt.ParseVMI(raw)
	if err != nil {
		return "", nil, err
	}
	m, err := kv.Migration()
	if err != nil || m == nil {
		return "", nil, err
	}
	at, launcher := m.Start, m.SourcePod
	if m.Completed {
		owner, launcher = m.TargetNode, m.TargetPod
		if !m.End.IsZero() {
			at = m.End
		}
	} else {
		owner = m.SourceNode
		if owner == "" {
			owner = kv.Status.NodeName
		}
	}
	if owner == "" || at.IsZero() || at.Unix() <= 0 {
		return owner, nil, nil
	}
	reported := vmiAddrs(u)
	if len(reported) == 0 {
		return owner, nil, nil
	}
	addrs, _, err := launcherAddrs(reported, pods.Pod(u.GetNamespace(), launcher), u.GetUID(), owner)
	if err != nil {
		return owner, nil, err
	}
	for _, a := range addrs {
		if err := heldByOther(a, u.GetUID(), pods.Holding(a)); err != nil {
			return owner, nil, err
		}
	}
	vm := VMName(u.GetNamespace(), u.GetName())
	gen := claimGeneration(at, m.Completed)
	for _, a := range addrs {
		claims = append(claims, agent.EndpointRoute{Addr: a, Generation: gen, VM: vm, Node: owner})
	}
	return owner, claims, nil
}

// claimGeneration orders the claim of a VMI's migration at (its end once it
// completed, else its start) against the VM endpoints the agents hold, in
// nanoseconds like the lab's claims. KubeVirt's migration timestamps are
// metav1.Time, one second on the wire: a migration back can start and end
// in the second the previous one started, which is the generation of the
// endpoint the VM left (incomingGeneration). A completed migration's claim
// is therefore one nanosecond after its second: it outranks every incoming
// endpoint of a migration started in that second, so the node the VM left
// steps aside instead of tying with the node it runs on.
func claimGeneration(at time.Time, completed bool) uint64 {
	gen := uint64(at.UnixNano())
	if completed {
		gen++
	}
	return gen
}

// incomingGeneration is the generation of a migration target's incoming
// endpoint: the migration's start (1 when KubeVirt reports none yet).
func incomingGeneration(m *kubevirt.Migration) uint64 {
	if gen := m.Start.UnixNano(); !m.Start.IsZero() && gen > 0 {
		return uint64(gen)
	}
	return 1
}

// podCache is what the claims read of the Pods.
type podCache interface {
	// Pod is a pod by name (nil when unknown).
	Pod(namespace, name string) *k8sobj.Pod
	// Holding are the pods that hold address a (podAddrs).
	Holding(a netip.Addr) []*k8sobj.Pod
}

// cachedPods is a podCache over a pod informer's indexer (with
// podAddrIndexers).
type cachedPods struct{ idx cache.Indexer }

func (c cachedPods) Pod(namespace, name string) *k8sobj.Pod {
	if c.idx == nil || name == "" {
		return nil
	}
	o, ok, _ := c.idx.GetByKey(namespace + "/" + name)
	if !ok {
		return nil
	}
	p, _ := o.(*k8sobj.Pod)
	return p
}

func (c cachedPods) Holding(a netip.Addr) []*k8sobj.Pod {
	if c.idx == nil {
		return nil
	}
	os, _ := c.idx.ByIndex(podAddrIndex, addrBucket(a))
	var out []*k8sobj.Pod
	for _, o := range os {
		if p, ok := o.(*k8sobj.Pod); ok && slices.Contains(podAddrs(p), a) { // its bucket's other pods hold other addresses
			out = append(out, p)
		}
	}
	return out
}

// vmiAddrs are the IPv4 addresses status.interfaces reports for the
// VMI's lanekit-bound interfaces (slimVMI keeps only those).
func vmiAddrs(u *unstructured.Unstructured) []netip.Addr {
	bound := boundNames(u)
	ifs, _, _ := unstructured.NestedSlice(u.Object, "status", "interfaces")
	var out []netip.Addr
	for _, i := range ifs {
		m, ok := i.(map[string]any)
		if !ok {
			continue
		}
		if name, _ := m["name"].(string); !bound[name] {
			continue
		}
		ips := []any{m["ipAddress"]}
		if more, ok := m["ipAddresses"].([]any); ok {
			ips = append(ips, more...)
		}
		for _, s := range ips {
			str, _ := s.(string)
			a, err := netip.ParseAddr(str)
			if err != nil || !a.Is4() || slices.Contains(out, a) {
				continue
			}
			out = append(out, a)
		}
	}
	return out
}

// boundNames are the names of the VMI's interfaces bound to lanekit; a
// slimmed VMI (no spec) has only those in its status.
func boundNames(u *unstructured.Unstructured) map[string]bool {
	out := map[string]bool{}
	ifs, ok, _ := unstructured.NestedSlice(u.Object, "spec", "domain", "devices", "interfaces")
	if !ok {
		ifs, _, _ = unstructured.NestedSlice(u.Object, "status", "interfaces")
		for _, i := range ifs {
			if m, ok := i.(map[string]any); ok {
				if name, _ := m["name"].(string); name != "" {
					out[name] = true
				}
			}
		}
		return out
	}
	for _, i := range ifs {
		m, ok := i.(map[string]any)
		if !ok {
			continue
		}
		b, _ := m["binding"].(map[string]any)
		if name, _ := m["name"].(string); name != "" && b != nil && b["name"] == kubevirt.BindingName {
			out[name] = true
		}
	}
	return out
}

// nodeInternalIPv4 is a node's first IPv4 InternalIP.
func nodeInternalIPv4(n *corev1.Node) netip.Addr {
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Is4() {
			return ip
		}
	}
	return netip.Addr{}
}

// desiredClaims are the claims of nodes other than self, each via its
// owner's InternalIP, sorted by address; claims whose owner has no IPv4
// InternalIP (yet) are left out and reported.
func desiredClaims(self string, vmis []any, nodes []any, pods podCache) ([]agent.EndpointRoute, []error) {
	via := map[string]netip.Addr{}
	for _, o := range nodes {
		if n, ok := o.(*corev1.Node); ok {
			if ip := nodeInternalIPv4(n); ip.IsValid() {
				via[n.Name] = ip
			}
		}
	}
	var out []agent.EndpointRoute
	var errs []error
	for _, o := range vmis {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		owner, claims, err := vmiClaims(u, pods)
		if err != nil {
			errs = append(errs, fmt.Errorf("vmi %s/%s: %w", u.GetNamespace(), u.GetName(), err))
			continue
		}
		if owner == self || len(claims) == 0 {
			continue
		}
		ip, ok := via[owner]
		if !ok {
			errs = append(errs, fmt.Errorf("vmi %s/%s: node %q that runs it has no IPv4 InternalIP", u.GetNamespace(), u.GetName(), owner))
			continue
		}
		for _, c := range claims {
			if !usableInPodCIDRs(c.Addr, nodes) {
				errs = append(errs, fmt.Errorf("vmi %s/%s: %s is not a usable address of any Node's pod CIDR: not claimed", u.GetNamespace(), u.GetName(), c.Addr))
				continue
			}
			c.Via = ip
			out = append(out, c)
		}
	}
	// One order on every node, ties included: each picks the same winner.
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		switch {
		case a.Addr != b.Addr:
			return a.Addr.Less(b.Addr)
		case a.Generation != b.Generation:
			return a.Generation < b.Generation
		case a.Node != b.Node:
			return a.Node < b.Node
		}
		return a.VM < b.VM
	})
	return out, errs
}

func (f *migrationFollower) kickClaims() {
	if f.claimsQ == nil {
		return
	}
	select {
	case f.claimsQ <- struct{}{}:
	default:
	}
}

// claimLoop recomputes the claims on each VMI or node change and hands the
// sink the full set when it changed; a failed sync is retried.
func (f *migrationFollower) claimLoop(ctx context.Context, vmis cache.SharedIndexInformer) {
	if !cache.WaitForCacheSync(ctx.Done(), vmis.HasSynced) {
		return
	}
	var last []agent.EndpointRoute
	synced := false
	var said string
	f.kickClaims()
	for {
		var retry <-chan time.Time
		select {
		case <-ctx.Done():
			return
		case <-f.claimsQ:
		}
		want, errs := desiredClaims(f.node, vmis.GetStore().List(), f.nodes.List(), cachedPods{f.pods})
		if msg := fmt.Sprint(errs); len(errs) > 0 && msg != said {
			f.log.Warn("moved VM addresses: claims left out", "errs", errs)
			said = msg
		}
		if synced && slices.Equal(want, last) {
			continue
		}
		n, superseded, err := f.claims.SyncEndpointRoutes(want)
		if err != nil {
			f.log.Warn("moved VM addresses: sync endpoint routes", "claims", len(want), "err", err, "retry", claimsRetry)
			retry = time.After(claimsRetry)
		} else {
			last, synced = want, true
			if len(want) > 0 || len(superseded) > 0 {
				f.log.Info("moved VM addresses synced", "claims", len(want), "routes", n, "superseded", superseded)
			}
		}
		if retry != nil {
			select {
			case <-ctx.Done():
				return
			case <-retry:
				f.kickClaims()
			case <-f.claimsQ:
				f.kickClaims()
			}
		}
	}
}
