package k8s

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// NodeUplink is the device that holds node's IPv4 InternalIP in the netns
// at path ("" = the caller's): the agent's default uplink on a cluster node.
func NodeUplink(ctx context.Context, client kubernetes.Interface, node, path string) (string, error) {
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("get node %s: %w", node, err)
	}
	var ip netip.Addr
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if p, err := netip.ParseAddr(a.Address); err == nil && p.Is4() {
			ip = p
			break
		}
	}
	if !ip.IsValid() {
		return "", fmt.Errorf("node %s has no IPv4 InternalIP", node)
	}
	h := &netlink.Handle{}
	if path != "" {
		ns, err := netns.GetFromPath(path)
		if err != nil {
			return "", fmt.Errorf("open netns %s: %w", path, err)
		}
		defer ns.Close()
		if h, err = netlink.NewHandleAt(ns); err != nil {
			return "", err
		}
		defer h.Close()
	}
	addrs, err := h.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return "", fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if got, ok := netip.AddrFromSlice(a.IP.To4()); ok && got == ip {
			l, err := h.LinkByIndex(a.LinkIndex)
			if err != nil {
				return "", err
			}
			return l.Attrs().Name, nil
		}
	}
	return "", fmt.Errorf("no device holds node %s's InternalIP %s", node, ip)
}

// NodeZone returns the Node's topology.kubernetes.io/zone label ("" without
// one): what EndpointSlice zone hints name.
func NodeZone(ctx context.Context, client kubernetes.Interface, node string) (string, error) {
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("get node %s: %w", node, err)
	}
	return n.Labels[corev1.LabelTopologyZone], nil
}
