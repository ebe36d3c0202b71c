package vf

import (
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Veth is the lab's VF: a veth pair created on demand, the representor end
// in the DPU's namespace (the caller's) and the VF end in the host's
// namespace (HostNetns), where the host agent finds it by name, the way a
// switchdev NIC shows a VF on the host and its representor on the DPU.
type Veth struct {
	HostNetns string // path of the host's network namespace
}

// Kind is KindVeth.
func (Veth) Kind() string { return KindVeth }

// Create makes the pair: rep here, VethName(rep) with MACFor(rep) in the
// host's namespace, both with mtu.
func (v Veth) Create(rep string, mtu int) (VF, error) {
	if err := checkRep(rep); err != nil {
		return VF{}, err
	}
	hostNS, err := ns.GetNS(v.HostNetns)
	if err != nil {
		return VF{}, fmt.Errorf("create vf for %s: host netns: %w", rep, err)
	}
	defer hostNS.Close()
	out := v.Describe(rep, MACFor(rep))
	la := netlink.LinkAttrs{Name: rep, MTU: mtu}
	err = netlink.LinkAdd(&netlink.Veth{
		LinkAttrs: la, PeerName: out.HostName, PeerMTU: uint32(mtu),
		PeerNamespace: netlink.NsFd(int(hostNS.Fd())), PeerHardwareAddr: out.MAC,
	})
	if err != nil {
		return VF{}, fmt.Errorf("create vf %s for representor %s: %w", out.HostName, rep, err)
	}
	return out, nil
}

// Delete removes the pair through its representor (the VF goes with it,
// wherever it is: the host or a pod).
func (Veth) Delete(rep string) error {
	l, err := netlink.LinkByName(rep)
	if notFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete representor %s: %w", rep, err)
	}
	if err := netlink.LinkDel(l); err != nil && !notFound(err) {
		return fmt.Errorf("delete representor %s: %w", rep, err)
	}
	return nil
}

// Describe is the lab VF of rep.
func (Veth) Describe(rep string, mac net.HardwareAddr) VF {
	return VF{Kind: KindVeth, HostName: VethName(rep), MAC: mac, Representor: rep}
}

func notFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}
