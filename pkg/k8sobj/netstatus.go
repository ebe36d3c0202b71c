package k8sobj

import (
	"encoding/json"
	"net/netip"
)

// NetworkStatusAnnotation is Multus' record of a pod's networks.
const NetworkStatusAnnotation = "k8s.v1.cni.cncf.io/network-status"

// NetworkStatus is one entry of the network-status annotation: what the
// agent (VM addresses, pkg/k8s) and `lanekit connectivity test` (a VM's
// fast-lane address, pkg/conncheck) read of it.
type NetworkStatus struct {
	Name       string   `json:"name"`
	IPs        []string `json:"ips"`
	Default    bool     `json:"default"`
	DeviceInfo *struct {
		Type string `json:"type"`
	} `json:"device-info"`
}

// Addrs are the entry's parseable addresses.
func (s NetworkStatus) Addrs() []netip.Addr {
	var set []netip.Addr
	for _, ip := range s.IPs {
		if a, err := netip.ParseAddr(ip); err == nil {
			set = append(set, a.Unmap())
		}
	}
	return set
}

// ParseNetworkStatus decodes a network-status annotation's value (no
// entries for an empty one).
func ParseNetworkStatus(raw string) ([]NetworkStatus, error) {
	if raw == "" {
		return nil, nil
	}
	var st []NetworkStatus
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		return nil, err
	}
	return st, nil
}
