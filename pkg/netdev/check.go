package netdev

import (
	"fmt"
	"net"
	"os"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/lanekit/lanekit/pkg/endpoint"
)

func writeSysctl(path, value string) error {
	return os.WriteFile(path, []byte(value), 0o644)
}

func hasRoute(routes []netlink.Route, want *netlink.Route) bool {
	for _, r := range routes {
		if r.LinkIndex != want.LinkIndex || r.Scope != want.Scope {
			continue
		}
		if r.Dst == nil || want.Dst == nil || r.Dst.String() != want.Dst.String() {
			continue
		}
		if !r.Gw.Equal(want.Gw) {
			continue
		}
		return true
	}
	return false
}

func defaultRouteMatches(routes []netlink.Route, want *netlink.Route) bool {
	for _, r := range routes {
		isDefault := r.Dst == nil || (r.Dst.IP.IsUnspecified() && net.IP(r.Dst.Mask).IsUnspecified())
		if isDefault && r.LinkIndex == want.LinkIndex && r.Gw.Equal(want.Gw) {
			return true
		}
	}
	return false
}

// checkLink finds the side ("host" or "pod") device name in the current
// namespace and checks its type, ifindex and that it is up.
func checkLink(side, name, wantType string, wantIndex int) (netlink.Link, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("%s device %s: %w", side, name, err)
	}
	a := l.Attrs()
	if l.Type() != wantType {
		return nil, fmt.Errorf("%s device %s is %s, want %s", side, name, l.Type(), wantType)
	}
	if a.Index != wantIndex {
		return nil, fmt.Errorf("%s device %s has ifindex %d, want %d", side, name, a.Index, wantIndex)
	}
	if a.Flags&net.FlagUp == 0 {
		return nil, fmt.Errorf("%s device %s is down", side, name)
	}
	return l, nil
}

// CheckPod verifies that the pair for spec exists as links describes: the
// host end up with the pod's /32 routed to it, the pod end up with the
// address, the gateway route and the default route.
func (h *Host) CheckPod(spec PodSpec, links PodLinks) error {
	wantType := string(spec.Mode)
	err := h.Do(func() error {
		l, err := checkLink("host", spec.HostIfName, wantType, links.HostIfIndex)
		if err != nil {
			return err
		}
		a := l.Attrs()
		if !spec.IP.IsValid() { // an IPv6-only node
			return checkHostIPv6(l, spec)
		}
		routes, err := netlink.RouteList(l, netlink.FAMILY_V4)
		if err != nil {
			return fmt.Errorf("list routes of %s: %w", spec.HostIfName, err)
		}
		if !hasRoute(routes, hostRoute(spec.IP, a.Index)) {
			return fmt.Errorf("no route %s/32 dev %s scope link", spec.IP, spec.HostIfName)
		}
		return checkHostIPv6(l, spec)
	})
	if err != nil {
		return fmt.Errorf("check %s: %w", spec.HostIfName, err)
	}
	err = ns.WithNetNSPath(spec.Netns, func(ns.NetNS) error {
		l, err := checkLink("pod", spec.IfName, wantType, links.IfIndex)
		if err != nil {
			return err
		}
		a := l.Attrs()
		if links.MAC != nil && a.HardwareAddr.String() != links.MAC.String() {
			return fmt.Errorf("pod device %s has MAC %s, want %s", spec.IfName, a.HardwareAddr, links.MAC)
		}
		if !spec.IP.IsValid() { // an IPv6-only node
			return checkPodIPv6(l, spec)
		}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			return fmt.Errorf("list addresses of %s: %w", spec.IfName, err)
		}
		found := false
		for _, ad := range addrs {
			ones, _ := ad.Mask.Size()
			if ad.IP.Equal(spec.IP.AsSlice()) && ones == 32 {
				found = true
			}
		}
		if !found {
			return fmt.Errorf("pod device %s lacks %s/32", spec.IfName, spec.IP)
		}
		routes, err := netlink.RouteList(l, netlink.FAMILY_V4)
		if err != nil {
			return fmt.Errorf("list routes of %s: %w", spec.IfName, err)
		}
		if !hasRoute(routes, gwRoute(a.Index)) {
			return fmt.Errorf("no route %s dev %s scope link", endpoint.GatewayIP, spec.IfName)
		}
		if !defaultRouteMatches(routes, defaultRoute(a.Index)) {
			return fmt.Errorf("no default route via %s dev %s", endpoint.GatewayIP, spec.IfName)
		}
		return checkPodIPv6(l, spec)
	})
	if err != nil {
		return fmt.Errorf("check %s in %s: %w", spec.IfName, spec.Netns, err)
	}
	return nil
}
