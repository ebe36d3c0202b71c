package vf

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/pkg/endpoint"
)

// Pod is how the host configures a VF inside a pod: what the DPU agent
// allocated for the endpoint.
type Pod struct {
	Netns  string // path of the pod's namespace
	IfName string // the VF's name inside the pod
	IP     netip.Addr
	IP6    netip.Addr // invalid: IPv4 only
	MTU    int
}

// AttachPod moves the host's VF named hostName into the pod, renames it,
// sets its MTU, brings it up and gives it the pod's address with the routes
// every lanekit pod has (the gateway endpoint.GatewayIP on the link, the
// default route through it; IPv6: a /128 and the default through
// endpoint.GatewayIP6). It returns the VF's ifindex inside the pod. On
// failure the VF is moved back to the host namespace when it can be.
func AttachPod(hostName string, p Pod) (int, error) {
	if !p.IP.Is4() {
		return 0, fmt.Errorf("attach vf %s: address %v is not IPv4", hostName, p.IP)
	}
	podNS, err := ns.GetNS(p.Netns)
	if err != nil {
		return 0, fmt.Errorf("attach vf %s: pod netns %s: %w", hostName, p.Netns, err)
	}
	defer podNS.Close()
	hostNS, err := ns.GetCurrentNS()
	if err != nil {
		return 0, fmt.Errorf("attach vf %s: %w", hostName, err)
	}
	defer hostNS.Close()
	l, err := netlink.LinkByName(hostName)
	if err != nil {
		return 0, fmt.Errorf("attach vf %s: find it on the host: %w", hostName, err)
	}
	if err := netlink.LinkSetNsFd(l, int(podNS.Fd())); err != nil {
		return 0, fmt.Errorf("attach vf %s: move into %s: %w", hostName, p.Netns, err)
	}
	var idx int
	err = podNS.Do(func(ns.NetNS) error {
		var err error
		idx, err = configure(hostName, p)
		if err != nil {
			// Back to the host under its own name: the DPU's delete (or
			// the next ADD) finds it there.
			if l, lerr := netlink.LinkByName(p.IfName); lerr == nil {
				netlink.LinkSetDown(l)
				netlink.LinkSetName(l, hostName)
			}
			if l, lerr := netlink.LinkByName(hostName); lerr == nil {
				if merr := netlink.LinkSetNsFd(l, int(hostNS.Fd())); merr != nil {
					err = errors.Join(err, fmt.Errorf("move %s back to the host: %w", hostName, merr))
				}
			}
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("attach vf %s in %s: %w", hostName, p.Netns, err)
	}
	return idx, nil
}

func configure(hostName string, p Pod) (int, error) {
	l, err := netlink.LinkByName(hostName)
	if err != nil {
		return 0, fmt.Errorf("find %s in the pod: %w", hostName, err)
	}
	if err := netlink.LinkSetName(l, p.IfName); err != nil {
		return 0, fmt.Errorf("rename %s to %s: %w", hostName, p.IfName, err)
	}
	if p.MTU > 0 {
		if err := netlink.LinkSetMTU(l, p.MTU); err != nil {
			return 0, fmt.Errorf("mtu %d on %s: %w", p.MTU, p.IfName, err)
		}
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return 0, fmt.Errorf("set %s up: %w", p.IfName, err)
	}
	idx := l.Attrs().Index
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: p.IP.AsSlice(), Mask: net.CIDRMask(32, 32)}}
	if err := netlink.AddrAdd(l, addr); err != nil {
		return 0, fmt.Errorf("add %s to %s: %w", addr.IPNet, p.IfName, err)
	}
	for _, r := range routes4(idx) {
		if err := netlink.RouteAdd(r); err != nil {
			return 0, fmt.Errorf("route %s on %s: %w", r.Dst, p.IfName, err)
		}
	}
	if p.IP6.IsValid() {
		for k, v := range map[string]string{"disable_ipv6": "0", "accept_ra": "0"} {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+p.IfName+"/"+k, []byte(v), 0o644); err != nil {
				return 0, fmt.Errorf("ipv6 %s on %s: %w", k, p.IfName, err)
			}
		}
		a6 := &netlink.Addr{IPNet: &net.IPNet{IP: p.IP6.AsSlice(), Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD}
		if err := netlink.AddrAdd(l, a6); err != nil {
			return 0, fmt.Errorf("add %s to %s: %w", a6.IPNet, p.IfName, err)
		}
		if err := netlink.RouteAdd(route6(idx)); err != nil {
			return 0, fmt.Errorf("ipv6 default route on %s: %w", p.IfName, err)
		}
	}
	return idx, nil
}

func routes4(idx int) []*netlink.Route {
	gw := endpoint.GatewayIP.AsSlice()
	return []*netlink.Route{
		{LinkIndex: idx, Dst: &net.IPNet{IP: gw, Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_LINK},
		{LinkIndex: idx, Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Gw: gw},
	}
}

func route6(idx int) *netlink.Route {
	return &netlink.Route{LinkIndex: idx, Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}, Gw: endpoint.GatewayIP6.AsSlice()}
}

// CheckPod verifies the pod side of a VF: p.IfName in the pod with mac, up,
// the pod's address and the default route through the gateway.
func CheckPod(p Pod, mac net.HardwareAddr) error {
	return ns.WithNetNSPath(p.Netns, func(ns.NetNS) error {
		l, err := netlink.LinkByName(p.IfName)
		if err != nil {
			return fmt.Errorf("check vf %s in %s: %w", p.IfName, p.Netns, err)
		}
		a := l.Attrs()
		if mac != nil && a.HardwareAddr.String() != mac.String() {
			return fmt.Errorf("check vf %s: MAC %s, want %s (not the VF the DPU made)", p.IfName, a.HardwareAddr, mac)
		}
		if a.Flags&net.FlagUp == 0 {
			return fmt.Errorf("check vf %s: down", p.IfName)
		}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			return fmt.Errorf("check vf %s: %w", p.IfName, err)
		}
		found := false
		for _, ad := range addrs {
			if ones, _ := ad.Mask.Size(); ad.IP.Equal(p.IP.AsSlice()) && ones == 32 {
				found = true
			}
		}
		if !found {
			return fmt.Errorf("check vf %s: lacks %s/32", p.IfName, p.IP)
		}
		rs, err := netlink.RouteList(l, netlink.FAMILY_V4)
		if err != nil {
			return fmt.Errorf("check vf %s: %w", p.IfName, err)
		}
		for _, r := range rs {
			isDefault := r.Dst == nil
			if r.Dst != nil {
				ones, _ := r.Dst.Mask.Size()
				isDefault = ones == 0
			}
			if isDefault && r.Gw.Equal(endpoint.GatewayIP.AsSlice()) {
				return nil
			}
		}
		return fmt.Errorf("check vf %s: no default route via %s", p.IfName, endpoint.GatewayIP)
	})
}

// DetachPod gives an SR-IOV VF back to the host namespace under hostName
// (a missing namespace or device is success: the VF went back with the
// namespace). The lab's veth VF needs nothing: the DPU deletes the pair.
func DetachPod(v VF, hostName string, p Pod) error {
	if v.Kind != KindSRIOV {
		return nil
	}
	podNS, err := ns.GetNS(p.Netns)
	if err != nil {
		return nil
	}
	defer podNS.Close()
	hostNS, err := ns.GetCurrentNS()
	if err != nil {
		return err
	}
	defer hostNS.Close()
	return podNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(p.IfName)
		if notFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		netlink.LinkSetDown(l)
		if err := netlink.LinkSetName(l, hostName); err != nil {
			return fmt.Errorf("detach vf %s: rename to %s: %w", p.IfName, hostName, err)
		}
		if err := netlink.LinkSetNsFd(l, int(hostNS.Fd())); err != nil {
			return fmt.Errorf("detach vf %s: back to the host: %w", hostName, err)
		}
		return nil
	})
}
