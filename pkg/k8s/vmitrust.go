package k8s

// Which addresses a VM may keep when it moves (issue 36 item 1). Who writes
// each field read here decides what it may be trusted with:
//
//   - A VMI's status.interfaces[].ipAddress(es) of a binding plugin's
//     interface: virt-handler copies it from the guest agent. The guest
//     writes it: it names nothing a node may route, and is used only where
//     it matches what follows.
//   - A VMI's status.migrationState (which pods and nodes, when): written by
//     virt-controller and virt-handler only (the VMI has no status
//     subresource; virt-api's VMI mutating webhook reverts a status change
//     by anyone but KubeVirt's service accounts).
//   - A launcher pod's spec.nodeName (the scheduler's binding, immutable) and
//     status.podIPs (kubelet, pods/status): not writable by a tenant.
//   - A launcher pod's k8s.v1.cni.cncf.io/network-status annotation: Multus
//     writes it through pods/status, on the node, from the CNI result
//     lanekit's plugin returned (the first launcher: a fresh address from
//     the node's IPAM; each migration target: the address its source
//     launcher pod was given, see incomingOf). The guest cannot write it;
//     but annotations are metadata, so whoever may patch pods in the VMI's
//     namespace (the default edit/admin roles) can rewrite it too.
//   - Node spec.podCIDRs: the node IPAM controller's.
//
// So an address is claimed for a VM only when (1) the VMI reports it, (2)
// the launcher pod of the node that runs the VM (the pod the migrationState
// names, created for this VMI, on that node) was given it, (3) it is a
// usable address of some Node's pod CIDR (not its network or broadcast
// address: what some node's IPAM could have handed out), and (4) no other
// pod holds it: not in the status.podIPs of a running pod (kubelet's, which
// no tenant can forge) nor in the network-status of another VMI's launcher
// pod. (4) is what keeps a namespace editor who rewrites their own launcher
// pod's network-status from taking a live pod's or VM's address.

import (
	"fmt"
	"hash/maphash"
	"net/netip"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// launcherNetworks returns the address sets of a VMI's launcher pod's
// secondary networks (one per network-status entry), after checking that the
// pod is that VMI's launcher (created by its UID) on node.
func launcherNetworks(pod *k8sobj.Pod, vmiUID types.UID, node string) ([][]netip.Addr, error) {
	if pod == nil {
		return nil, fmt.Errorf("launcher pod not found")
	}
	if pod.Labels[labelCreatedBy] != string(vmiUID) {
		return nil, fmt.Errorf("pod %s/%s is not a launcher pod of this VMI (%s=%q)", pod.Namespace, pod.Name, labelCreatedBy, pod.Labels[labelCreatedBy])
	}
	if node != "" && pod.Spec.NodeName != node {
		return nil, fmt.Errorf("launcher pod %s/%s runs on %q, not %q", pod.Namespace, pod.Name, pod.Spec.NodeName, node)
	}
	if pod.Annotations[k8sobj.NetworkStatusAnnotation] == "" {
		return nil, fmt.Errorf("launcher pod %s/%s has no network-status yet", pod.Namespace, pod.Name)
	}
	return secondaryNetworks(pod)
}

// networkStatuses are the entries of a pod's network-status annotation
// (none without it).
func networkStatuses(pod *k8sobj.Pod) ([]k8sobj.NetworkStatus, error) {
	st, err := k8sobj.ParseNetworkStatus(pod.Annotations[k8sobj.NetworkStatusAnnotation])
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s network-status: %w", pod.Namespace, pod.Name, err)
	}
	return st, nil
}

// secondaryNetworks are the address sets of a pod's secondary networks, one
// per entry of its network-status annotation (none without it).
func secondaryNetworks(pod *k8sobj.Pod) ([][]netip.Addr, error) {
	st, err := networkStatuses(pod)
	if err != nil {
		return nil, err
	}
	var out [][]netip.Addr
	for _, s := range st {
		if !s.Default {
			out = append(out, s.Addrs())
		}
	}
	return out, nil
}

// podAddrIndex indexes the source's Pods by the addresses they hold, in
// buckets: a pod is indexed under the bucket of each address it holds
// (addrBucket), and Holding keeps the bucket's pods that hold the address.
// The informer's index keeps a set (a map) per index value: a value per
// address was a map per pod, most of the index at 50,000 pods; a bucket's
// set holds many. The hash is seeded per process, so addresses written
// into annotations cannot be chosen to fill one bucket.
const podAddrIndex = "lanekit-addr"

// podAddrBuckets bounds the index's values (a dozen pods a bucket at 50,000).
const podAddrBuckets = 4096

var (
	addrSeed    = maphash.MakeSeed()
	bucketNames = func() []string {
		out := make([]string, podAddrBuckets)
		for i := range out {
			out[i] = strconv.Itoa(i)
		}
		return out
	}()
)

// addrBucket is a's bucket in podAddrIndex.
func addrBucket(a netip.Addr) string {
	return bucketNames[maphash.Comparable(addrSeed, a)%podAddrBuckets]
}

// podAddrIndexers index a pod under the bucket of each address it holds
// (podAddrs).
var podAddrIndexers = cache.Indexers{podAddrIndex: func(o any) ([]string, error) {
	p, ok := o.(*k8sobj.Pod)
	if !ok {
		return nil, nil
	}
	var out []string
	for _, a := range podAddrs(p) {
		if b := addrBucket(a); !slices.Contains(out, b) {
			out = append(out, b)
		}
	}
	return out, nil
}}

// podAddrs are the addresses a pod holds: its status.podIPs and the
// addresses of its secondary networks, unless it runs in the host network
// or has terminated (its addresses went back to the IPAM).
func podAddrs(p *k8sobj.Pod) []netip.Addr {
	if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return nil
	}
	var out []netip.Addr
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil && !slices.Contains(out, a.Unmap()) {
			out = append(out, a.Unmap())
		}
	}
	nets, _ := secondaryNetworks(p)
	for _, set := range nets {
		for _, a := range set {
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out
}

// heldByOther refuses address a of the VMI vmiUID when a pod other than
// that VMI's launcher pods holds it (holders: the pods that hold a).
func heldByOther(a netip.Addr, vmiUID types.UID, holders []*k8sobj.Pod) error {
	for _, p := range holders {
		if p.Labels[labelCreatedBy] == string(vmiUID) && !slices.Contains(p.Status.PodIPs, corev1.PodIP{IP: a.String()}) {
			continue // one of this VMI's launcher pods, given a on lanekit's network
		}
		return fmt.Errorf("%s is held by pod %s/%s on node %q: not trusted", a, p.Namespace, p.Name, p.Spec.NodeName)
	}
	return nil
}

// launcherAddrs keeps the reported addresses of VMI vmiUID that its launcher
// pod on node was given (launcherNetworks, verifiedAddrs), with the network
// each is in.
func launcherAddrs(reported []netip.Addr, pod *k8sobj.Pod, vmiUID types.UID, node string) (kept []netip.Addr, net [][]netip.Addr, err error) {
	nets, err := launcherNetworks(pod, vmiUID, node)
	if err != nil {
		return nil, nil, err
	}
	return verifiedAddrs(reported, nets)
}

// verifiedAddrs keeps the reported addresses that the launcher pod's
// networks hold; the first reported address that no network of the pod holds
// is an error (a guest naming an address lanekit did not give it). It also
// returns the network each kept address is in (for its other family).
func verifiedAddrs(reported []netip.Addr, nets [][]netip.Addr) (kept []netip.Addr, net [][]netip.Addr, err error) {
	for _, a := range reported {
		i := slices.IndexFunc(nets, func(set []netip.Addr) bool { return slices.Contains(set, a) })
		if i < 0 {
			return nil, nil, fmt.Errorf("the VMI reports %s, which its launcher pod was not given (network-status %v): not trusted", a, nets)
		}
		kept, net = append(kept, a), append(net, nets[i])
	}
	return kept, net, nil
}

// usableInPodCIDRs says whether a is a usable address of one of the Nodes'
// pod CIDRs: inside one, and not its network or (IPv4) broadcast address.
func usableInPodCIDRs(a netip.Addr, nodes []any) bool {
	for _, o := range nodes {
		n, ok := o.(*corev1.Node)
		if !ok {
			continue
		}
		cidrs := n.Spec.PodCIDRs
		if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
			cidrs = []string{n.Spec.PodCIDR}
		}
		for _, c := range cidrs {
			p, err := netip.ParsePrefix(c)
			if err != nil || !p.Contains(a) {
				continue
			}
			p = p.Masked()
			return a != p.Addr() && (!a.Is4() || a != lastAddr(p))
		}
	}
	return false
}

// lastAddr is the last address of an IPv4 prefix (its broadcast address).
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().As4()
	for i := p.Bits(); i < 32; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	return netip.AddrFrom4(b)
}

// claimInputsChanged says whether a pod update changes what the claims of
// moved VM addresses read from pods (launcherNetworks, podAddrs): every pod
// update in the cluster would otherwise recompute every VMI's claims.
func claimInputsChanged(old, cur any) bool {
	o, ok1 := old.(*k8sobj.Pod)
	c, ok2 := cur.(*k8sobj.Pod)
	if !ok1 || !ok2 {
		return true
	}
	return o.Labels[labelCreatedBy] != c.Labels[labelCreatedBy] || o.Spec.NodeName != c.Spec.NodeName ||
		o.Annotations[k8sobj.NetworkStatusAnnotation] != c.Annotations[k8sobj.NetworkStatusAnnotation] ||
		!slices.Equal(podAddrs(o), podAddrs(c))
}
