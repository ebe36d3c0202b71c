// Package vf is what a VF is to the host/DPU split (issue 28): the pod's
// device, whose other end (the representor) lives on the DPU where the
// datapath runs. The DPU side creates a VF with its representor
// (Representors); the host side moves the VF into the pod and configures it
// (AttachPod). Two kinds: the lab's veth pair across the host and DPU
// namespaces (veth.go), and an SR-IOV virtual function with its switchdev
// representor found through sysfs and set up through netlink (sriov.go).
package vf

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
)

// Kinds of VF.
const (
	KindVeth  = "veth"
	KindSRIOV = "sriov"
)

// ErrNoFreeVF: every VF of the PF has an endpoint.
var ErrNoFreeVF = errors.New("no free VF")

// VF is one pod device as the host sees it before it moves into the pod.
type VF struct {
	Kind string
	// Index is the VF number on its PF (sriov).
	Index uint32
	// HostName is the VF's netdev in the host namespace (veth; sriov: found
	// through the PF's virtfn<Index> on the host).
	HostName string
	MAC      net.HardwareAddr
	// Representor is the DPU-side device: the endpoint's host-side device,
	// where the pod programs attach.
	Representor string
}

// Representors is the DPU side of VFs: Create makes (or claims) a VF whose
// representor is named rep, Delete gives it back. A missing representor is
// success for Delete.
type Representors interface {
	Kind() string
	Create(rep string, mtu int) (VF, error)
	Delete(rep string) error
	// Describe is the VF of an existing representor rep whose VF has mac
	// (from the endpoint's record), without touching devices.
	Describe(rep string, mac net.HardwareAddr) VF
}

// VethName is the host-side name of the lab VF whose representor is rep
// (an endpoint's host device, "lk" + 11 hex digits): "lkv" + the digits.
func VethName(rep string) string {
	if len(rep) > 2 {
		return "lkv" + rep[2:]
	}
	return "lkv" + rep
}

// MACFor derives a locally administered unicast MAC for the VF of rep, so
// the DPU knows the VF's address without reading the host.
func MACFor(rep string) net.HardwareAddr {
	sum := sha256.Sum256([]byte("lanekit-vf/" + rep))
	mac := net.HardwareAddr(append([]byte(nil), sum[:6]...))
	mac[0] = mac[0]&0xfe | 0x02
	return mac
}

func checkRep(rep string) error {
	if rep == "" || len(rep) > 14 {
		return fmt.Errorf("representor name %q: want 1-14 characters", rep)
	}
	return nil
}
