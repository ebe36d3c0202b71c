// Package kubevirt is lanekit's KubeVirt network binding plugin: the hook
// server virt-launcher calls (Info, OnDefineDomain) and the rewrite of the
// libvirt domain XML that puts a VMI's lanekit interfaces on vhost-user.
package kubevirt

import (
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
)

// BindingName is the network binding plugin's default name, the key under
// KubeVirt.spec.configuration.network.binding.
const BindingName = "lanekit"

// MaxQueues caps the queue count like KubeVirt does for multiqueue NICs.
const MaxQueues = 256

// VMI is the part of a kubevirt.io/v1 VirtualMachineInstance the binding
// reads (field names as in kubevirt.io/api core/v1; unknown fields ignored).
type VMI struct {
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		Domain struct {
			CPU *struct {
				Cores   uint32 `json:"cores"`
				Sockets uint32 `json:"sockets"`
				Threads uint32 `json:"threads"`
			} `json:"cpu"`
			Resources struct {
				Requests map[string]resource.Quantity `json:"requests"`
				Limits   map[string]resource.Quantity `json:"limits"`
			} `json:"resources"`
			Devices struct {
				Interfaces                 []Interface `json:"interfaces"`
				NetworkInterfaceMultiQueue *bool       `json:"networkInterfaceMultiqueue"`
				UseVirtioTransitional      *bool       `json:"useVirtioTransitional"`
			} `json:"devices"`
		} `json:"domain"`
		Networks []struct {
			Name string `json:"name"`
		} `json:"networks"`
	} `json:"spec"`
	Status struct {
		NodeName   string `json:"nodeName"`
		Interfaces []struct {
			Name string `json:"name"`
			MAC  string `json:"mac"`
		} `json:"interfaces"`
		MigrationState *migrationStateJSON `json:"migrationState"`
	} `json:"status"`
}

// Interface is a VMI interface (spec.domain.devices.interfaces[]).
type Interface struct {
	Name    string `json:"name"`
	Binding *struct {
		Name string `json:"name"`
	} `json:"binding"`
	MacAddress string `json:"macAddress"`
	Model      string `json:"model"`
	PciAddress string `json:"pciAddress"`
	BootOrder  *uint  `json:"bootOrder"`
	ACPIIndex  int    `json:"acpiIndex"`
}

// ParseVMI decodes the VMI JSON virt-launcher sends with OnDefineDomain.
func ParseVMI(data []byte) (*VMI, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("parse vmi: empty")
	}
	var v VMI
	if err := json.Unmarshal(data, &v); err != nil {
		return nil, fmt.Errorf("parse vmi: %w", err)
	}
	return &v, nil
}

// BoundInterfaces returns the VMI's interfaces bound to the named binding
// plugin, in spec order.
func (v *VMI) BoundInterfaces(binding string) []Interface {
	var out []Interface
	for _, i := range v.Spec.Domain.Devices.Interfaces {
		if i.Binding != nil && i.Binding.Name == binding {
			out = append(out, i)
		}
	}
	return out
}

// VCPUs is the guest's vCPU count the way KubeVirt derives it: the CPU
// topology (cores x sockets x threads, each defaulting to 1), or, with no
// topology, the CPU limit, else the CPU request, rounded up.
func (v *VMI) VCPUs() uint32 {
	cores, sockets, threads := uint32(1), uint32(1), uint32(1)
	c := v.Spec.Domain.CPU
	if c != nil {
		if c.Cores != 0 {
			cores = c.Cores
		}
		if c.Sockets != 0 {
			sockets = c.Sockets
		}
		if c.Threads != 0 {
			threads = c.Threads
		}
	}
	if c == nil || (c.Cores == 0 && c.Sockets == 0 && c.Threads == 0) {
		r := v.Spec.Domain.Resources
		if q, ok := r.Limits["cpu"]; ok {
			sockets = uint32(q.Value())
		} else if q, ok := r.Requests["cpu"]; ok {
			sockets = uint32(q.Value())
		}
		if sockets == 0 {
			sockets = 1
		}
	}
	return cores * sockets * threads
}

// Queues is the number of queue pairs of a VMI's virtio NICs: its vCPU count
// (capped at MaxQueues) when spec.domain.devices.networkInterfaceMultiqueue
// is true, else 1. The agent must give the VM endpoint and lanekit-vhost the
// same count.
func (v *VMI) Queues() uint32 {
	mq := v.Spec.Domain.Devices.NetworkInterfaceMultiQueue
	if mq == nil || !*mq {
		return 1
	}
	return min(v.VCPUs(), MaxQueues)
}
