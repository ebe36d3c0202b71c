package k8s

// Which addresses a VM may keep when it moves (issue 36 item 1). A VMI's
// status.interfaces[].ipAddress(es) of a binding plugin's interface is filled
// by virt-handler from the guest agent: the guest writes it, so it names
// nothing a node may route. What lanekit itself gave the VM is in its
// launcher pod's network-status annotation: Multus writes it on the node,
// with its own credentials, from the CNI result lanekit's plugin returned
// (the first launcher: a fresh address from the node's IPAM; each migration
// target: the address its source launcher pod was given, see incomingOf).
// A VMI-reported address is used only when the launcher pod of the node that
// runs the VM was given it, and only when it is a usable address of some
// Node's pod CIDR (not its network or broadcast address).

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// networkStatusAnnotation is Multus' record of a pod's networks.
const networkStatusAnnotation = "k8s.v1.cni.cncf.io/network-status"

// networkStatus is one entry of the network-status annotation.
type networkStatus struct {
	Name    string   `json:"name"`
	IPs     []string `json:"ips"`
	Default bool     `json:"default"`
}

// launcherNetworks returns the address sets of a VMI's launcher pod's
// secondary networks (one per network-status entry), after checking that the
// pod is that VMI's launcher (created by its UID) on node.
func launcherNetworks(pod *corev1.Pod, vmiUID types.UID, node string) ([][]netip.Addr, error) {
	if pod == nil {
		return nil, fmt.Errorf("launcher pod not found")
	}
	if pod.Labels[labelCreatedBy] != string(vmiUID) {
		return nil, fmt.Errorf("pod %s/%s is not a launcher pod of this VMI (%s=%q)", pod.Namespace, pod.Name, labelCreatedBy, pod.Labels[labelCreatedBy])
	}
	if node != "" && pod.Spec.NodeName != node {
		return nil, fmt.Errorf("launcher pod %s/%s runs on %q, not %q", pod.Namespace, pod.Name, pod.Spec.NodeName, node)
	}
	raw := pod.Annotations[networkStatusAnnotation]
	if raw == "" {
		return nil, fmt.Errorf("launcher pod %s/%s has no network-status yet", pod.Namespace, pod.Name)
	}
	var st []networkStatus
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		return nil, fmt.Errorf("launcher pod %s/%s network-status: %w", pod.Namespace, pod.Name, err)
	}
	var out [][]netip.Addr
	for _, s := range st {
		if s.Default {
			continue
		}
		var set []netip.Addr
		for _, ip := range s.IPs {
			if a, err := netip.ParseAddr(ip); err == nil {
				set = append(set, a.Unmap())
			}
		}
		out = append(out, set)
	}
	return out, nil
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
