package kubevirt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// NetworkInfoPath is where KubeVirt mounts the binding sidecar's downward
// API file (the kubevirt.io/network-info annotation) when the binding is
// registered with downwardAPI: device-info.
const NetworkInfoPath = "/etc/podinfo/network-info"

// NetworkInfo is KubeVirt's kubevirt.io/network-info annotation: per VMI
// network, the device-info Multus reported in the pod's network-status.
type NetworkInfo struct {
	Interfaces []NetworkInfoInterface `json:"interfaces"`
}

// NetworkInfoInterface is one network's entry.
type NetworkInfoInterface struct {
	Network    string      `json:"network"`
	DeviceInfo *DeviceInfo `json:"deviceInfo,omitempty"`
	MAC        string      `json:"mac,omitempty"`
}

// DeviceInfo follows the NPWG device-info spec (v1.1.0); lanekit reads the
// vhost-user part.
type DeviceInfo struct {
	Type      string     `json:"type"`
	Version   string     `json:"version"`
	VhostUser *VhostUser `json:"vhost-user,omitempty"`
}

// VhostUser is device-info's vhost-user map. Mode is the role of the
// application in the pod (QEMU): "client" means the host side (lanekit-vhost)
// created the socket and QEMU connects to it; "server" means QEMU creates it.
type VhostUser struct {
	Mode string `json:"mode"`
	Path string `json:"path"`
}

// ParseNetworkInfo decodes the network-info file.
func ParseNetworkInfo(data []byte) (*NetworkInfo, error) {
	var n NetworkInfo
	if err := json.Unmarshal(data, &n); err != nil {
		return nil, fmt.Errorf("parse network-info: %w", err)
	}
	return &n, nil
}

// VhostSocket is where and how QEMU reaches one interface's backend.
type VhostSocket struct {
	Path string
	Mode string // libvirt <source mode>: client or server
	MAC  string // as reported in network-info, if any
}

// Socket returns the vhost-user socket reported for a VMI network.
func (n *NetworkInfo) Socket(network string) (VhostSocket, error) {
	for _, i := range n.Interfaces {
		if i.Network != network {
			continue
		}
		d := i.DeviceInfo
		if d == nil {
			return VhostSocket{}, fmt.Errorf("network %q: no deviceInfo in network-info (the CNI did not report device-info)", network)
		}
		if d.Type != "vhost-user" {
			return VhostSocket{}, fmt.Errorf("network %q: device-info type %q, want vhost-user", network, d.Type)
		}
		if d.VhostUser == nil || d.VhostUser.Path == "" {
			return VhostSocket{}, fmt.Errorf("network %q: device-info has no vhost-user path", network)
		}
		if !filepath.IsAbs(d.VhostUser.Path) {
			return VhostSocket{}, fmt.Errorf("network %q: device-info vhost-user path %q is not absolute", network, d.VhostUser.Path)
		}
		if d.VhostUser.Mode != "client" && d.VhostUser.Mode != "server" {
			return VhostSocket{}, fmt.Errorf("network %q: device-info vhost-user mode %q, want client or server", network, d.VhostUser.Mode)
		}
		return VhostSocket{Path: d.VhostUser.Path, Mode: d.VhostUser.Mode, MAC: i.MAC}, nil
	}
	return VhostSocket{}, fmt.Errorf("network %q: %w", network, errNoNetwork)
}

var errNoNetwork = errors.New("not in network-info")

// InfoSource reads the network-info file, waiting for it: kubelet refreshes
// downward API files after virt-controller sets the annotation, which can lag
// virt-launcher's OnDefineDomain call.
type InfoSource struct {
	Path     string        // default NetworkInfoPath
	Wait     time.Duration // how long to wait for the networks to appear
	Interval time.Duration // poll interval
	read     func(string) ([]byte, error)
}

// Sockets returns the socket of every named network, polling until all are
// present or Wait has passed.
func (s *InfoSource) Sockets(ctx context.Context, networks []string) (map[string]VhostSocket, error) {
	path := s.Path
	if path == "" {
		path = NetworkInfoPath
	}
	read := s.read
	if read == nil {
		read = os.ReadFile
	}
	interval := s.Interval
	if interval <= 0 {
		interval = 500 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, s.Wait)
	defer cancel()
	for {
		out, err := s.try(read, path, networks)
		if err == nil {
			return out, nil
		}
		if !retryable(err) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (waited %s for %s)", err, s.Wait, path)
		case <-time.After(interval):
		}
	}
}

// retryable: the file or a network is not there yet; anything else (bad
// JSON, wrong device type) is final.
func retryable(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, errNoNetwork) || errors.Is(err, errEmpty)
}

var errEmpty = errors.New("empty")

func (s *InfoSource) try(read func(string) ([]byte, error), path string, networks []string) (map[string]VhostSocket, error) {
	data, err := read(path)
	if err != nil {
		return nil, fmt.Errorf("read network-info: %w", err)
	}
	if len(data) == 0 {
		return nil, fmt.Errorf("network-info %s: %w", path, errEmpty)
	}
	info, err := ParseNetworkInfo(data)
	if err != nil {
		return nil, err
	}
	out := make(map[string]VhostSocket, len(networks))
	for _, n := range networks {
		sock, err := info.Socket(n)
		if err != nil {
			return nil, err
		}
		out[n] = sock
	}
	return out, nil
}
