// Package netdev creates, checks and deletes pod devices (veth or netkit
// pairs) and probes the kernel features the datapath needs. Host-side work
// runs in the agent's network namespace (or one given to NewHost); pod-side
// work runs inside ns.Do on a locked OS thread.
package netdev

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/endpoint"
)

// Host is the node side of pod devices: the namespace the agent runs in, or
// another one (tests, the lab) given by path.
type Host struct {
	ns ns.NetNS // nil: the calling thread's namespace
}

// NewHost returns the node side in the namespace at nsPath, or in the
// current one if nsPath is empty.
func NewHost(nsPath string) (*Host, error) {
	if nsPath == "" {
		return &Host{}, nil
	}
	n, err := ns.GetNS(nsPath)
	if err != nil {
		return nil, fmt.Errorf("open host netns %s: %w", nsPath, err)
	}
	return &Host{ns: n}, nil
}

// Close releases the namespace handle.
func (h *Host) Close() error {
	if h.ns == nil {
		return nil
	}
	return h.ns.Close()
}

// Do runs fn in the host namespace.
func (h *Host) Do(fn func() error) error {
	if h.ns == nil {
		return fn()
	}
	return h.ns.Do(func(ns.NetNS) error { return fn() })
}

// PodSpec describes a pod device to create.
type PodSpec struct {
	Mode       datapath.DeviceMode
	HostIfName string // host end / netkit primary
	IfName     string // inside the pod
	Netns      string // path of the pod's namespace
	IP         netip.Addr
	IP6        netip.Addr // invalid: no IPv6 (ipv6.go)
	MTU        int
	// Queues > 0 makes a VM device (veth only): both ends get exactly Queues
	// tx and rx queues (every rx queue has an AF_XDP socket bound to it), and
	// the host end gets tx checksum offload off.
	Queues int
	// MAC of the pod end; nil: random.
	MAC net.HardwareAddr
	// NoRoutes leaves the namespace's routes alone: a second device in a
	// namespace that has its own default route (a VM device beside a
	// virt-launcher pod's eth0).
	NoRoutes bool
	// BIGTCP sizes both ends' GSO/GRO limits (bigtcp.go); not for a VM
	// device (Queues > 0), whose frames go one by one through AF_XDP.
	BIGTCP BIGTCP
	// CongestionControl, when set, is the pod namespace's TCP congestion
	// control (net.ipv4.tcp_congestion_control, per namespace), e.g. bbr.
	CongestionControl string
}

// MaxVMQueues bounds PodSpec.Queues.
const MaxVMQueues = 256

// PodLinks is what the kernel assigned to a created pair.
type PodLinks struct {
	HostIfIndex int
	HostMAC     net.HardwareAddr // nil for netkit L3
	IfIndex     int
	MAC         net.HardwareAddr // nil for netkit L3
}

// tempPeerName is the pod end's name until it is renamed inside the pod.
func tempPeerName(hostIfName string) string {
	if len(hostIfName) > 2 {
		return "lkp" + hostIfName[2:]
	}
	return "lkp" + hostIfName
}

func hostRoute(ip netip.Addr, ifindex int) *netlink.Route {
	return &netlink.Route{
		LinkIndex: ifindex,
		Dst:       &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)},
		Scope:     netlink.SCOPE_LINK,
	}
}

func gwRoute(ifindex int) *netlink.Route {
	return &netlink.Route{
		LinkIndex: ifindex,
		Dst:       &net.IPNet{IP: endpoint.GatewayIP.AsSlice(), Mask: net.CIDRMask(32, 32)},
		Scope:     netlink.SCOPE_LINK,
	}
}

func defaultRoute(ifindex int) *netlink.Route {
	return &netlink.Route{
		LinkIndex: ifindex,
		Dst:       &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
		Gw:        endpoint.GatewayIP.AsSlice(),
	}
}

// SetupPod creates the pair for spec, moves and configures the pod end inside
// the pod's namespace, brings the host end up and routes the pod's address
// to it. On failure it deletes what it created.
func (h *Host) SetupPod(spec PodSpec) (links PodLinks, err error) {
	// No IPv4 address: an IPv6-only node (the pod has spec.IP6 only).
	if spec.IP.IsValid() && !spec.IP.Is4() || !spec.IP.IsValid() && !spec.IP6.IsValid() {
		return links, fmt.Errorf("setup %s: address %v is not IPv4", spec.HostIfName, spec.IP)
	}
	podNS, err := ns.GetNS(spec.Netns)
	if err != nil {
		return links, fmt.Errorf("setup %s: open pod netns %s: %w", spec.HostIfName, spec.Netns, err)
	}
	defer podNS.Close()
	peer := tempPeerName(spec.HostIfName)
	if spec.Queues < 0 || spec.Queues > MaxVMQueues {
		return links, fmt.Errorf("setup %s: %d queues (0..%d)", spec.HostIfName, spec.Queues, MaxVMQueues)
	}
	if spec.Queues > 0 && spec.Mode != datapath.ModeVeth {
		return links, fmt.Errorf("setup %s: a multiqueue device must be a veth, not %s", spec.HostIfName, spec.Mode)
	}

	err = h.Do(func() error {
		switch {
		case spec.Queues > 0:
			q := uint32(spec.Queues)
			veth := &netlink.Veth{
				LinkAttrs:        netlink.LinkAttrs{Name: spec.HostIfName, MTU: spec.MTU, NumTxQueues: spec.Queues, NumRxQueues: spec.Queues},
				PeerName:         peer,
				PeerMTU:          uint32(spec.MTU),
				PeerNumTxQueues:  q,
				PeerNumRxQueues:  q,
				PeerHardwareAddr: spec.MAC,
			}
			if err := netlink.LinkAdd(veth); err != nil {
				return fmt.Errorf("create veth %s with %d queues: %w", spec.HostIfName, spec.Queues, err)
			}
			p, err := netlink.LinkByName(peer)
			if err == nil {
				err = netlink.LinkSetNsFd(p, int(podNS.Fd()))
			}
			if err != nil {
				netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: spec.HostIfName}})
				return fmt.Errorf("move %s into the pod: %w", peer, err)
			}
		case spec.Mode == datapath.ModeVeth:
			veth := &netlink.Veth{
				LinkAttrs:        netlink.LinkAttrs{Name: spec.HostIfName, MTU: spec.MTU},
				PeerName:         peer,
				PeerMTU:          uint32(spec.MTU),
				PeerNamespace:    netlink.NsFd(int(podNS.Fd())),
				PeerHardwareAddr: spec.MAC,
			}
			if err := netlink.LinkAdd(veth); err != nil {
				return fmt.Errorf("create veth %s: %w", spec.HostIfName, err)
			}
		case spec.Mode.Netkit():
			if err := CreateNetkit(netkitPodSpec(spec, peer, int(podNS.Fd()))); err != nil {
				return fmt.Errorf("create netkit %s: %w", spec.HostIfName, err)
			}
		default:
			return fmt.Errorf("create %s: unknown device mode %q", spec.HostIfName, spec.Mode)
		}
		return nil
	})
	if err != nil {
		return links, fmt.Errorf("setup %s: %w", spec.HostIfName, err)
	}
	defer func() {
		if err != nil {
			if derr := h.DeletePod(spec.HostIfName); derr != nil {
				err = errors.Join(err, fmt.Errorf("undo: %w", derr))
			}
		}
	}()

	err = podNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(peer)
		if err != nil {
			return fmt.Errorf("find %s in pod: %w", peer, err)
		}
		if err := netlink.LinkSetName(l, spec.IfName); err != nil {
			return fmt.Errorf("rename %s to %s: %w", peer, spec.IfName, err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up: %w", spec.IfName, err)
		}
		if spec.BIGTCP.On() && spec.Queues == 0 {
			if err := setBIGTCP(l, spec.BIGTCP); err != nil {
				return err
			}
		}
		idx := l.Attrs().Index
		if spec.IP.IsValid() {
			addr := &netlink.Addr{IPNet: &net.IPNet{IP: spec.IP.AsSlice(), Mask: net.CIDRMask(32, 32)}}
			if err := netlink.AddrAdd(l, addr); err != nil {
				return fmt.Errorf("add %s to %s: %w", addr.IPNet, spec.IfName, err)
			}
		}
		if !spec.NoRoutes && spec.IP.IsValid() {
			if err := netlink.RouteAdd(gwRoute(idx)); err != nil {
				return fmt.Errorf("add gateway route on %s: %w", spec.IfName, err)
			}
			if err := netlink.RouteAdd(defaultRoute(idx)); err != nil {
				return fmt.Errorf("add default route on %s: %w", spec.IfName, err)
			}
		}
		if err := setupPodIPv6(l, spec); err != nil {
			return err
		}
		if spec.CongestionControl != "" {
			if err := writeSysctl(congestionControlSysctl, spec.CongestionControl); err != nil {
				return fmt.Errorf("pod congestion control %s: %w", spec.CongestionControl, err)
			}
		}
		l, err = netlink.LinkByIndex(idx)
		if err != nil {
			return fmt.Errorf("read %s: %w", spec.IfName, err)
		}
		links.IfIndex = idx
		if len(l.Attrs().HardwareAddr) > 0 {
			links.MAC = l.Attrs().HardwareAddr
		}
		return nil
	})
	if err != nil {
		return links, fmt.Errorf("setup %s in %s: %w", spec.IfName, spec.Netns, err)
	}

	err = h.Do(func() error {
		l, err := netlink.LinkByName(spec.HostIfName)
		if err != nil {
			return fmt.Errorf("find %s: %w", spec.HostIfName, err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up: %w", spec.HostIfName, err)
		}
		if spec.BIGTCP.On() && spec.Queues == 0 {
			if err := setBIGTCP(l, spec.BIGTCP); err != nil {
				return err
			}
		}
		if spec.Queues > 0 {
			// A VM device: what is sent to the VM must leave with complete
			// checksums (see SetTxChecksum).
			if err := SetTxChecksum(spec.HostIfName, false); err != nil {
				return err
			}
		}
		if spec.IP.IsValid() {
			if err := netlink.RouteReplace(hostRoute(spec.IP, l.Attrs().Index)); err != nil {
				return fmt.Errorf("route %s to %s: %w", spec.IP, spec.HostIfName, err)
			}
		}
		if err := setupHostIPv6(l, spec); err != nil {
			return err
		}
		links.HostIfIndex = l.Attrs().Index
		if len(l.Attrs().HardwareAddr) > 0 {
			links.HostMAC = l.Attrs().HardwareAddr
		}
		return nil
	})
	if err != nil {
		return links, fmt.Errorf("setup %s: %w", spec.HostIfName, err)
	}
	return links, nil
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

// DeletePod deletes the host end of a pod device (which takes the pod end
// with it). A missing device is success.
func (h *Host) DeletePod(hostIfName string) error {
	return h.Do(func() error {
		l, err := netlink.LinkByName(hostIfName)
		if isNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("find %s: %w", hostIfName, err)
		}
		if err := netlink.LinkDel(l); err != nil && !isNotFound(err) {
			return fmt.Errorf("delete %s: %w", hostIfName, err)
		}
		return nil
	})
}

// HostLink describes a host-side device if it exists.
type HostLink struct {
	Index int
	MAC   net.HardwareAddr
	Type  string
	Up    bool
}

// LookupHost returns the host-side device named name; ok is false if there
// is none.
func (h *Host) LookupHost(name string) (hl HostLink, ok bool, err error) {
	err = h.Do(func() error {
		l, err := netlink.LinkByName(name)
		if isNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("find %s: %w", name, err)
		}
		ok = true
		a := l.Attrs()
		hl = HostLink{Index: a.Index, MAC: a.HardwareAddr, Type: l.Type(), Up: a.Flags&net.FlagUp != 0}
		return nil
	})
	return hl, ok, err
}

// LinkMTU returns the MTU of the host device name (e.g. the uplink).
func (h *Host) LinkMTU(name string) (int, error) {
	var mtu int
	err := h.Do(func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return fmt.Errorf("find %s: %w", name, err)
		}
		mtu = l.Attrs().MTU
		return nil
	})
	return mtu, err
}

// EnableForwarding sets net.ipv4.ip_forward=1 in the host namespace.
func (h *Host) EnableForwarding() error {
	return h.Do(func() error {
		if err := writeSysctl("/proc/sys/net/ipv4/ip_forward", "1"); err != nil {
			return fmt.Errorf("enable ip forwarding: %w", err)
		}
		return nil
	})
}

// netkitPodSpec is the netkit pair of a pod: L3 (no MACs, no ARP) or, for
// datapath.ModeNetkitL2, L2 with the peer's MAC the spec asks for (else the
// kernel's random one); the host may send by default, the pod only through
// the attached program.
func netkitPodSpec(spec PodSpec, peer string, podNetnsFd int) NetkitSpec {
	ns := NetkitSpec{Name: spec.HostIfName, PeerName: peer, MTU: spec.MTU, PeerNetnsFd: podNetnsFd,
		Mode: NetkitL3, Policy: NetkitPass, PeerPolicy: NetkitDrop}
	if spec.Mode == datapath.ModeNetkitL2 {
		ns.Mode, ns.PeerMAC = NetkitL2, spec.MAC
	}
	return ns
}
