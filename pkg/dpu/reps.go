package dpu

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev"
	"github.com/lanekit/lanekit/pkg/vf"
)

// Representors are the DPU agent's pod devices (agent.PodDevices): each
// endpoint's host-side device is the representor of a VF, created through
// vf.Representors, up, with the pod's /32 (and /128) routed to it in the
// DPU's namespace. The pod side is the host agent's: this side never sees
// the pod's namespace. Netlink work runs in the caller's namespace (the DPU
// agent's own).
type Representors struct {
	Reps vf.Representors
	// Netns is the DPU's namespace when it is not the caller's (tests).
	Netns string
}

func (r Representors) do(fn func() error) error {
	if r.Netns == "" {
		return fn()
	}
	return ns.WithNetNSPath(r.Netns, func(ns.NetNS) error { return fn() })
}

// SetupPod creates the VF and its representor spec.HostIfName. VM devices
// (spec.Queues) are not offloaded.
func (r Representors) SetupPod(spec netdev.PodSpec) (links netdev.PodLinks, err error) {
	err = r.do(func() error {
		var err error
		links, err = r.setupPod(spec)
		return err
	})
	return links, err
}

func (r Representors) setupPod(spec netdev.PodSpec) (links netdev.PodLinks, err error) {
	if spec.Queues > 0 {
		return links, fmt.Errorf("setup %s: VM devices on a DPU node are not supported", spec.HostIfName)
	}
	if spec.Mode != datapath.ModeVeth {
		return links, fmt.Errorf("setup %s: a representor is a %s device, the DPU agent needs --device-mode veth", spec.HostIfName, spec.Mode)
	}
	v, err := r.Reps.Create(spec.HostIfName, spec.MTU)
	if err != nil {
		return links, fmt.Errorf("setup %s: %w", spec.HostIfName, err)
	}
	defer func() {
		if err != nil {
			if derr := r.Reps.Delete(spec.HostIfName); derr != nil {
				err = errors.Join(err, fmt.Errorf("undo: %w", derr))
			}
		}
	}()
	l, err := netlink.LinkByName(spec.HostIfName)
	if err != nil {
		return links, fmt.Errorf("setup %s: find representor: %w", spec.HostIfName, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return links, fmt.Errorf("setup %s: set up: %w", spec.HostIfName, err)
	}
	for _, rt := range repRoutes(spec, l.Attrs().Index) {
		if err := netlink.RouteReplace(rt); err != nil {
			return links, fmt.Errorf("setup %s: route %s: %w", spec.HostIfName, rt.Dst, err)
		}
	}
	if spec.IP6.IsValid() {
		if err := os.WriteFile(filepath.Join("/proc/sys/net/ipv6/conf", spec.HostIfName, "disable_ipv6"), []byte("0"), 0o644); err != nil {
			return links, fmt.Errorf("setup %s: ipv6: %w", spec.HostIfName, err)
		}
	}
	links.HostIfIndex = l.Attrs().Index
	links.HostMAC = l.Attrs().HardwareAddr
	links.MAC = v.MAC
	return links, nil
}

func repRoutes(spec netdev.PodSpec, idx int) []*netlink.Route {
	out := []*netlink.Route{{LinkIndex: idx, Scope: netlink.SCOPE_LINK,
		Dst: &net.IPNet{IP: spec.IP.AsSlice(), Mask: net.CIDRMask(32, 32)}}}
	if spec.IP6.IsValid() {
		out = append(out, &netlink.Route{LinkIndex: idx, Dst: &net.IPNet{IP: spec.IP6.AsSlice(), Mask: net.CIDRMask(128, 128)}})
	}
	return out
}

// DeletePod gives the VF back (the lab: deletes the pair).
func (r Representors) DeletePod(hostIfName string) error {
	return r.do(func() error { return r.Reps.Delete(hostIfName) })
}

// CheckPod verifies the DPU side: the representor with its ifindex, up,
// with the pod's route. The host agent checks the VF in the pod.
func (r Representors) CheckPod(spec netdev.PodSpec, links netdev.PodLinks) error {
	return r.do(func() error { return checkRep(spec, links) })
}

func checkRep(spec netdev.PodSpec, links netdev.PodLinks) error {
	l, err := netlink.LinkByName(spec.HostIfName)
	if err != nil {
		return fmt.Errorf("check representor %s: %w", spec.HostIfName, err)
	}
	a := l.Attrs()
	if links.HostIfIndex != 0 && a.Index != links.HostIfIndex {
		return fmt.Errorf("check representor %s: ifindex %d, recorded %d", spec.HostIfName, a.Index, links.HostIfIndex)
	}
	if a.Flags&net.FlagUp == 0 {
		return fmt.Errorf("check representor %s: down", spec.HostIfName)
	}
	routes, err := netlink.RouteList(l, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("check representor %s: %w", spec.HostIfName, err)
	}
	for _, rt := range routes {
		if rt.Dst != nil && rt.Dst.IP.Equal(spec.IP.AsSlice()) {
			if ones, _ := rt.Dst.Mask.Size(); ones == 32 {
				return nil
			}
		}
	}
	return fmt.Errorf("check representor %s: no route %s/32", spec.HostIfName, spec.IP)
}

// CheckNetns accepts any absolute path: the pod's namespace is on the host,
// which checks it (Host.AddEndpoint).
func (Representors) CheckNetns(path string) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("netns %q: want the host's absolute path", path)
	}
	return nil
}
