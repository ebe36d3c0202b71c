package agent

import (
	"fmt"
	"os"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/netdev"
)

// PodDevices is where a pod endpoint's devices come from (the seam of the
// host/DPU split, issue 28). Locally (nil Config.PodDevices) it is a
// veth/netkit pair whose pod end the agent configures inside the pod's
// namespace. The DPU agent (pkg/dpu) creates a VF and its representor: the
// representor is the endpoint's host-side device where the pod programs
// attach, and the host agent configures the VF in a namespace this agent
// cannot see.
type PodDevices interface {
	SetupPod(netdev.PodSpec) (netdev.PodLinks, error)
	// DeletePod removes the devices of the host-side device name; a missing
	// one is success.
	DeletePod(hostIfName string) error
	CheckPod(netdev.PodSpec, netdev.PodLinks) error
	// CheckNetns validates the pod's namespace path of a request (wrapped
	// in ErrBadNetns by the caller).
	CheckNetns(path string) error
}

// localDevices are pairs in a namespace on this machine.
type localDevices struct{ *netdev.Host }

func (localDevices) CheckNetns(path string) error {
	if path == "" {
		return fmt.Errorf("netns is empty")
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("netns %s: %w", path, err)
	}
	if fi.IsDir() {
		return fmt.Errorf("netns %s is a directory", path)
	}
	return nil
}

// NewAPIServer is the agent's API (the Agent gRPC service) as a value, for a
// server that forwards to it on another transport (the DPU service).
func NewAPIServer(a *Agent) apiv1.AgentServer { return &server{a: a} }

// ProbeEncryption probes the kernel's ESP and WireGuard facilities (the DPU
// agent's IPsec offload check uses the same probe as --encryption).
func ProbeEncryption() EncryptionFeatures { return probeEncryption() }
