// Package endpoint is the agent's record of one attachment (a pod's
// interface, later a VM's), as stored and as handed to the datapath.
package endpoint

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/lanekit/lanekit/pkg/datapath"
)

// Kind is what sits behind an endpoint.
type Kind string

const (
	KindPod Kind = "pod" // a network namespace with a veth or netkit device
	KindVM  Kind = "vm"  // a VM behind vhost-user (later)
)

// GatewayIP is the pod's next hop. It is on no device: the datapath answers
// the pod's ARP requests for it with the host-side device MAC.
var GatewayIP = netip.MustParseAddr("169.254.1.1")

// Endpoint is one attachment and everything needed to recreate, check or
// delete it.
type Endpoint struct {
	ID          uint32              `json:"id"`
	Kind        Kind                `json:"kind"`
	ContainerID string              `json:"containerID"`
	IfName      string              `json:"ifName"` // inside the pod
	Netns       string              `json:"netns"`
	Network     string              `json:"network,omitempty"`
	Mode        datapath.DeviceMode `json:"mode"`
	HostIfName  string              `json:"hostIfName"`
	HostIfIndex int                 `json:"hostIfIndex"`
	HostMAC     string              `json:"hostMAC,omitempty"` // empty for netkit L3
	IfIndex     int                 `json:"ifIndex"`           // inside the pod
	MAC         string              `json:"mac,omitempty"`     // empty for netkit L3
	IP          netip.Addr          `json:"ip"`
	MTU         int                 `json:"mtu"`
	Labels      map[string]string   `json:"labels,omitempty"`
	Created     time.Time           `json:"created"`
}

// Key is the attachment key: the endpoint's identity in the store and IPAM.
func Key(containerID, ifname string) string { return containerID + "/" + ifname }

// Key returns e's attachment key.
func (e *Endpoint) Key() string { return Key(e.ContainerID, e.IfName) }

// HostIfName is the host-side device name for an attachment: "lk" and the
// first 11 hex digits of sha256(containerID+ifname), 13 characters.
func HostIfName(containerID, ifname string) string {
	sum := sha256.Sum256([]byte(containerID + ifname))
	return "lk" + hex.EncodeToString(sum[:])[:11]
}

// IDKey encodes an endpoint ID as a store key (big-endian, so keys sort by ID).
func IDKey(id uint32) []byte {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], id)
	return b[:]
}

// Validate checks the fields an attachment request must carry.
func Validate(containerID, ifname string) error {
	if containerID == "" {
		return errors.New("container ID is empty")
	}
	if ifname == "" {
		return errors.New("interface name is empty")
	}
	if len(ifname) > 15 {
		return fmt.Errorf("interface name %q is longer than 15 characters", ifname)
	}
	for _, c := range ifname {
		if c == '/' || c == ':' || c <= ' ' {
			return fmt.Errorf("interface name %q contains %q", ifname, c)
		}
	}
	if ifname == "." || ifname == ".." {
		return fmt.Errorf("interface name %q is invalid", ifname)
	}
	return nil
}

// Datapath returns what the datapath needs to forward for e.
func (e *Endpoint) Datapath() (datapath.Endpoint, error) {
	dp := datapath.Endpoint{
		ID:      e.ID,
		Mode:    e.Mode,
		IfName:  e.HostIfName,
		IfIndex: e.HostIfIndex,
		IP:      e.IP,
	}
	var err error
	if dp.MAC, err = parseMAC(e.MAC); err != nil {
		return dp, fmt.Errorf("endpoint %d mac: %w", e.ID, err)
	}
	if dp.HostMAC, err = parseMAC(e.HostMAC); err != nil {
		return dp, fmt.Errorf("endpoint %d host mac: %w", e.ID, err)
	}
	return dp, nil
}

func parseMAC(s string) (net.HardwareAddr, error) {
	if s == "" {
		return nil, nil
	}
	return net.ParseMAC(s)
}
