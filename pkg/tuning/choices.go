package tuning

import (
	"fmt"

	"github.com/lanekit/lanekit/pkg/netdev"
)

// Choice is a decision lanekit takes because of the kernel's features.
type Choice struct {
	What   string `json:"what"`
	Chosen string `json:"chosen"`
	Why    string `json:"why"`
}

// Choices derives what lanekit does on a kernel with f. deviceMode and
// modeReason, when the agent reports them, replace the derived pod device
// choice (the agent's --device-mode may override auto).
func Choices(f netdev.Features, deviceMode, modeReason string) []Choice {
	dev := Choice{What: "pod device"}
	switch {
	case deviceMode != "":
		dev.Chosen, dev.Why = deviceMode, modeReason+" (reported by the agent)"
	case f.Netkit.Supported:
		dev.Chosen, dev.Why = "netkit", "netkit pairs can be created: programs run in the device's xmit path"
	default:
		dev.Chosen, dev.Why = "veth", "no netkit on this kernel: veth with tcx on the host end"
	}
	xdp := Choice{What: "VM steering (steer_vm)"}
	if f.XDP.Supported {
		xdp.Chosen, xdp.Why = "native XDP", "attached in driver mode on the VM's endpoint device (veth has native XDP)"
	} else {
		xdp.Chosen, xdp.Why = "none", "no XDP: the VM fast lane is unavailable ("+f.XDP.Detail+")"
	}
	sock := Choice{What: "AF_XDP sockets"}
	switch {
	case !f.AFXDP.Supported:
		sock.Chosen, sock.Why = "none", "no AF_XDP: the VM fast lane is unavailable ("+f.AFXDP.Detail+")"
	case f.AFXDPZeroCopy.Supported:
		sock.Chosen, sock.Why = "copy", "bound in copy mode on the VM's veth (veth has no zero-copy); the uplink's driver could do zero-copy"
	default:
		sock.Chosen, sock.Why = "copy", "bound in copy mode on the VM's veth (veth has no zero-copy)"
	}
	uplink := Choice{What: "uplink to pod"}
	if f.RedirectPeer.Supported {
		uplink.Chosen, uplink.Why = "bpf_redirect_peer", "straight into the pod's namespace, no second stack pass"
	} else {
		uplink.Chosen, uplink.Why = "stack", fmt.Sprintf("no bpf_redirect_peer (%s)", f.RedirectPeer.Detail)
	}
	return []Choice{dev, xdp, sock, uplink}
}
