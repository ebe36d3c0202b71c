package k8s

// Services for VMs. A Service that selects a VM selects its virt-launcher pod
// (KubeVirt copies the VMI's labels onto it), so the endpointslice controller
// lists the launcher pod's own address, where nothing answers: the guest is
// on lanekit's VM network, a secondary network with its own address. The
// source hands the agent such a slice with the launcher pod's address
// replaced by the VM's, so ClusterIPs, NodePorts and LoadBalancers reach the
// guest the way they reach a pod (KubeVirt's pod-network bindings give the
// same result by giving the VM the pod's address).
//
// Trust (vmitrust.go): the VM's address is read from the launcher pod's
// network-status, which a namespace editor can rewrite. It is used only when
// it is on a network whose device-info is vhost-user (a lanekit VM
// attachment), a usable address of some Node's pod CIDR, and held by no pod
// but this VMI's launcher pods — the rules a moved VM address is claimed by.
// An editor can thus point their own Service at no one else's workload; the
// EndpointSlice API lets them name any address anyway.

import (
	"net/netip"
	"slices"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// sliceByPodIndex indexes EndpointSlices by the pods their endpoints name.
const sliceByPodIndex = "lanekit-pod"

var sliceIndexers = cache.Indexers{sliceByPodIndex: func(o any) ([]string, error) {
	es, ok := o.(*k8sobj.EndpointSlice)
	if !ok {
		return nil, nil
	}
	var out []string
	for _, e := range es.Endpoints {
		if ns, name, ok := targetPod(es, e); ok && !slices.Contains(out, ns+"/"+name) {
			out = append(out, ns+"/"+name)
		}
	}
	return out, nil
}}

// targetPod is the pod an endpoint of es names (its namespace defaults to
// the slice's).
func targetPod(es *k8sobj.EndpointSlice, e k8sobj.Endpoint) (ns, name string, ok bool) {
	r := e.TargetRef // a Pod's, or nil (k8sobj.SlimEndpointSlice)
	if r == nil || r.Name == "" {
		return "", "", false
	}
	ns = r.Namespace
	if ns == "" {
		ns = es.Namespace
	}
	return ns, r.Name, true
}

// vmNetworks are the address sets of a pod's lanekit VM attachments: the
// network-status entries whose device-info is vhost-user.
func vmNetworks(pod *k8sobj.Pod) [][]netip.Addr {
	st, _ := networkStatuses(pod)
	var out [][]netip.Addr
	for _, s := range st {
		if !s.Default && s.DeviceInfo != nil && s.DeviceInfo.Type == "vhost-user" {
			out = append(out, s.Addrs())
		}
	}
	return out
}

// vmBackend is the VM address that stands for a launcher pod's endpoint of
// the given family (discovery address type), if the pod is a VMI's launcher
// with exactly one trusted lanekit VM address of that family.
func vmBackend(pod *k8sobj.Pod, family discoveryv1.AddressType, pods podCache, nodes []any) (netip.Addr, bool) {
	vmi := types.UID(pod.Labels[labelCreatedBy])
	if vmi == "" || pod.Spec.HostNetwork {
		return netip.Addr{}, false
	}
	var found []netip.Addr
	for _, set := range vmNetworks(pod) {
		for _, a := range set {
			if a.Is4() != (family == discoveryv1.AddressTypeIPv4) || slices.Contains(found, a) {
				continue
			}
			if !usableInPodCIDRs(a, nodes) || heldByOther(a, vmi, pods.Holding(a)) != nil {
				continue
			}
			found = append(found, a)
		}
	}
	if len(found) != 1 {
		return netip.Addr{}, false
	}
	return found[0], true
}

// vmSlice returns es with the endpoints that name a VMI's launcher pod
// rewritten to the VM's address (a copy: es may be the informer cache's),
// or es itself when none does; a VM listed twice (its source and target
// launcher pods during a migration) keeps its first endpoint. nodes is
// called only for a slice that names a launcher pod.
func vmSlice(es *k8sobj.EndpointSlice, pods podCache, nodes func() []any) *k8sobj.EndpointSlice {
	if es.AddressType != discoveryv1.AddressTypeIPv4 && es.AddressType != discoveryv1.AddressTypeIPv6 {
		return es
	}
	vms := map[int]netip.Addr{}
	var ns []any
	for i, e := range es.Endpoints {
		tns, name, ok := targetPod(es, e)
		if !ok {
			continue
		}
		if p := pods.Pod(tns, name); p != nil && p.Labels[labelCreatedBy] != "" {
			if ns == nil {
				ns = nodes()
			}
			if a, ok := vmBackend(p, es.AddressType, pods, ns); ok {
				vms[i] = a
			}
		}
	}
	if len(vms) == 0 {
		return es
	}
	out := es.DeepCopy()
	kept := out.Endpoints[:0]
	var seen []string
	for i, e := range out.Endpoints {
		if a, ok := vms[i]; ok {
			if slices.Contains(seen, a.String()) {
				continue
			}
			e.Addresses = []string{a.String()}
		}
		seen = append(seen, e.Addresses...)
		kept = append(kept, e)
	}
	out.Endpoints = kept
	return out
}

// kickSlicesOf queues the EndpointSlices that name pod p.
func (s *Source) kickSlicesOf(p *k8sobj.Pod) {
	if p == nil || p.Labels[labelCreatedBy] == "" {
		return
	}
	inf := s.kinds[k8sobj.KindEndpointSlice]
	os, _ := inf.GetIndexer().ByIndex(sliceByPodIndex, p.Namespace+"/"+p.Name)
	for _, o := range os {
		if es, ok := o.(*k8sobj.EndpointSlice); ok {
			s.queue.Add(objKey{kind: k8sobj.KindEndpointSlice, namespace: es.Namespace, name: es.Name})
		}
	}
}

// object is toObject with a slice's launcher pods replaced by their VMs.
func (s *Source) object(kind k8sobj.Kind, o any) (k8sobj.Object, error) {
	obj, err := toObject(kind, o)
	if err == nil && obj.EndpointSlice != nil {
		obj.EndpointSlice = vmSlice(obj.EndpointSlice, cachedPods{s.pods.GetIndexer()}, s.nodes.GetStore().List)
	}
	return obj, err
}

// podOf is the pod of an informer event (a tombstone's too), or nil.
func podOf(o any) *k8sobj.Pod {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	p, _ := o.(*k8sobj.Pod)
	return p
}
