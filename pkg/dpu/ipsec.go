package dpu

import (
	"fmt"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev"
)

// IPsec offload (the seam, not an implementation): on a DPU node,
// node-to-node encryption belongs on the DPU, between the representors and
// the uplink, as xfrm states and policies in the DPU's namespace (with the
// NIC's crypto offload when it has one): keys never reach the host, and the
// host agent's API does not change. The DPU agent probes the DPU kernel's
// ESP (AES-GCM) support with the same probe as lanekitd --encryption and
// refuses a configuration that asks for it: this kernel has no ESP, and
// lanekit does not implement encryption yet.

// IPsecOffload values for the DPU agent's --ipsec-offload.
const (
	IPsecOffloadOff = "off"
	IPsecOffloadOn  = "on"
)

// CheckIPsecOffload refuses "on": with the kernel's reason when it lacks
// ESP, plainly when it has it.
func CheckIPsecOffload(want string, esp netdev.Feature) error {
	switch want {
	case "", IPsecOffloadOff:
		return nil
	case IPsecOffloadOn:
	default:
		return fmt.Errorf("--ipsec-offload %q: want on or off", want)
	}
	if !esp.Supported {
		return fmt.Errorf("--ipsec-offload on: %w: the DPU's kernel has no ESP: %s", datapath.ErrNotSupported, esp.Detail)
	}
	return fmt.Errorf("--ipsec-offload on: the DPU's kernel has ESP (%s), but lanekit does not implement encryption yet", esp.Detail)
}
