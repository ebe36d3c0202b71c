package netdev

import (
	"fmt"
	"net"

	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// IPv6 for pod devices: the pod's /128 (no duplicate address detection: the
// agent's IPAM owns the address), a default route through the link-local
// gateway (endpoint.GatewayIP6, answered by the datapath's NDP responder;
// no router advertisements), and on the host end a /128 route to the pod.

// setupPodIPv6 configures spec.IP6 on the pod device l (inside the pod's
// namespace). Nothing without an IPv6 address.
func setupPodIPv6(l netlink.Link, spec PodSpec) error {
	if !spec.IP6.IsValid() {
		return nil
	}
	name := spec.IfName // l was renamed to it
	// A namespace may start with IPv6 off on new devices; pods never take
	// router advertisements (the routes are set here).
	for k, v := range map[string]string{"disable_ipv6": "0", "accept_ra": "0"} {
		if err := writeSysctl("/proc/sys/net/ipv6/conf/"+name+"/"+k, v); err != nil {
			return fmt.Errorf("ipv6 %s on %s: %w", k, name, err)
		}
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: spec.IP6.AsSlice(), Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD}
	if err := netlink.AddrAdd(l, addr); err != nil {
		return fmt.Errorf("add %s to %s: %w", addr.IPNet, name, err)
	}
	if spec.NoRoutes {
		return nil
	}
	if err := netlink.RouteAdd(defaultRoute6(l.Attrs().Index)); err != nil {
		return fmt.Errorf("add IPv6 default route on %s: %w", name, err)
	}
	return nil
}

func defaultRoute6(ifindex int) *netlink.Route {
	return &netlink.Route{
		LinkIndex: ifindex,
		Dst:       &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)},
		Gw:        endpoint.GatewayIP6.AsSlice(),
	}
}

func hostRoute6(spec PodSpec, ifindex int) *netlink.Route {
	return &netlink.Route{
		LinkIndex: ifindex,
		Dst:       &net.IPNet{IP: spec.IP6.AsSlice(), Mask: net.CIDRMask(128, 128)},
	}
}

// setupHostIPv6 routes spec.IP6 to the host end l (in the node's
// namespace), with IPv6 on for it (the host resolves the pod and takes what
// the datapath hands to its stack).
func setupHostIPv6(l netlink.Link, spec PodSpec) error {
	if !spec.IP6.IsValid() {
		return nil
	}
	name := l.Attrs().Name
	if err := writeSysctl("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", "0"); err != nil {
		return fmt.Errorf("ipv6 on %s: %w", name, err)
	}
	if err := netlink.RouteReplace(hostRoute6(spec, l.Attrs().Index)); err != nil {
		return fmt.Errorf("route %s to %s: %w", spec.IP6, name, err)
	}
	return nil
}

// EnableForwarding6 turns IPv6 forwarding on in the node's namespace
// (bpf_fib_lookup answers FWD_DISABLED without it).
func (h *Host) EnableForwarding6() error {
	return h.Do(func() error {
		if err := writeSysctl("/proc/sys/net/ipv6/conf/all/forwarding", "1"); err != nil {
			return fmt.Errorf("enable ipv6 forwarding: %w", err)
		}
		return nil
	})
}

// checkHostIPv6 verifies the host end's /128 route to spec.IP6 (CheckPod).
func checkHostIPv6(l netlink.Link, spec PodSpec) error {
	if !spec.IP6.IsValid() {
		return nil
	}
	routes, err := netlink.RouteList(l, netlink.FAMILY_V6)
	if err != nil {
		return fmt.Errorf("list IPv6 routes of %s: %w", spec.HostIfName, err)
	}
	want := hostRoute6(spec, l.Attrs().Index)
	for _, r := range routes {
		if r.LinkIndex == want.LinkIndex && r.Dst != nil && r.Dst.String() == want.Dst.String() {
			return nil
		}
	}
	return fmt.Errorf("no route %s/128 dev %s", spec.IP6, spec.HostIfName)
}

// checkPodIPv6 verifies spec.IP6/128 and the default route via the IPv6
// gateway on the pod device l (CheckPod, inside the pod's namespace).
func checkPodIPv6(l netlink.Link, spec PodSpec) error {
	if !spec.IP6.IsValid() {
		return nil
	}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V6)
	if err != nil {
		return fmt.Errorf("list IPv6 addresses of %s: %w", spec.IfName, err)
	}
	found := false
	for _, ad := range addrs {
		if ones, _ := ad.Mask.Size(); ad.IP.Equal(spec.IP6.AsSlice()) && ones == 128 {
			found = true
		}
	}
	if !found {
		return fmt.Errorf("pod device %s lacks %s/128", spec.IfName, spec.IP6)
	}
	if spec.NoRoutes {
		return nil
	}
	routes, err := netlink.RouteList(l, netlink.FAMILY_V6)
	if err != nil {
		return fmt.Errorf("list IPv6 routes of %s: %w", spec.IfName, err)
	}
	if !defaultRouteMatches(routes, defaultRoute6(l.Attrs().Index)) {
		return fmt.Errorf("no IPv6 default route via %s dev %s", endpoint.GatewayIP6, spec.IfName)
	}
	return nil
}
