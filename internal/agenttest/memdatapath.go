// Package agenttest holds the agent's test doubles: MemoryDatapath, an
// in-memory datapath injected through agent.Config.OpenDatapath. Only _test.go
// files import it, so no shipped binary links it (cmd/lanekit's
// TestShippedBinariesLinkNoTestCode checks).
package agenttest

import (
	"fmt"
	"slices"
	"sync"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/service"
)

// MemoryDatapath is an in-memory datapath for tests (injected through
// agent.Config.OpenDatapath; lanekitd has no flag for it): it forwards nothing and
// remembers the endpoints it was given, so the control plane (ADD/CHECK/DEL/
// GC, re-adoption and the crash sweep) runs without BPF. VMs are remembered as the BPF datapath's
// steering programs and lk_xsks would hold them.
type MemoryDatapath struct {
	mu   sync.Mutex
	eps  map[uint32]datapath.Endpoint
	vms  map[uint32]datapath.VM // by endpoint id
	xsks map[uint32]int         // socket slot -> fd as published

	// Service and policy maps (memservices.go).
	svcs       memServices
	pol        memPolicy
	verdicts   map[uint32]datapath.PolicyVerdict
	failApply  bool
	refuseSvc  map[service.ServiceKey]bool // RefuseService
	svcApplies int
	gcCalls    int
}

// It serves VM endpoints too (agent.VMDatapath, asserted in pkg/agent's
// tests: this package does not import the agent).
var _ datapath.Datapath = (*MemoryDatapath)(nil)

// NewMemoryDatapath returns an empty MemoryDatapath.
func NewMemoryDatapath() *MemoryDatapath {
	return &MemoryDatapath{eps: map[uint32]datapath.Endpoint{}, vms: map[uint32]datapath.VM{}, xsks: map[uint32]int{}}
}

// AttachVM registers vm (checked like the BPF datapath checks it).
func (m *MemoryDatapath) AttachVM(vm datapath.VM) error {
	switch {
	case vm.ID == 0:
		return fmt.Errorf("attach vm: id 0 is reserved")
	case vm.IfIndex <= 0:
		return fmt.Errorf("attach vm %d: bad ifindex %d", vm.ID, vm.IfIndex)
	case len(vm.MAC) != 6:
		return fmt.Errorf("attach vm %d: mac must be 6 bytes", vm.ID)
	case vm.Queues < 1 || vm.Queues > 256:
		return fmt.Errorf("attach vm %d: %d queues (1..256)", vm.ID, vm.Queues)
	case int(vm.XSKBase)+vm.Queues > datapath.MaxXSKs:
		return fmt.Errorf("attach vm %d: socket slots beyond %d", vm.ID, datapath.MaxXSKs)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.vms[vm.ID] = vm
	return nil
}

// SetVMSocket records fd as the socket of vm's queue.
func (m *MemoryDatapath) SetVMSocket(vm datapath.VM, queue int, fd int) error {
	if queue < 0 || queue >= vm.Queues {
		return fmt.Errorf("vm %d: queue %d out of range", vm.ID, queue)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.xsks[vm.XSKBase+uint32(queue)] = fd
	return nil
}

// DetachVM forgets vm and its socket slots; what is gone is not an error.
func (m *MemoryDatapath) DetachVM(vm datapath.VM) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.vms, vm.ID)
	for q := 0; q < vm.Queues; q++ {
		delete(m.xsks, vm.XSKBase+uint32(q))
	}
	return nil
}

// VM returns what was last attached for id.
func (m *MemoryDatapath) VM(id uint32) (datapath.VM, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	vm, ok := m.vms[id]
	return vm, ok
}

// SocketSlots returns the number of published socket slots.
func (m *MemoryDatapath) SocketSlots() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.xsks)
}

func (m *MemoryDatapath) UpsertEndpoint(ep datapath.Endpoint) error {
	if ep.ID == 0 {
		return fmt.Errorf("upsert endpoint: id 0 is reserved")
	}
	if ep.IfIndex <= 0 {
		return fmt.Errorf("upsert endpoint %d: no ifindex", ep.ID)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.eps[ep.ID] = ep
	return nil
}

func (m *MemoryDatapath) DeleteEndpoint(ep datapath.Endpoint) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.eps, ep.ID)
	return nil
}

func (m *MemoryDatapath) Endpoints() ([]uint32, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := make([]uint32, 0, len(m.eps))
	for id := range m.eps {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// Endpoint returns what was last upserted for id.
func (m *MemoryDatapath) Endpoint(id uint32) (datapath.Endpoint, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ep, ok := m.eps[id]
	return ep, ok
}

func (m *MemoryDatapath) Counters(id uint32) (datapath.Counters, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.eps[id]; !ok {
		return datapath.Counters{}, fmt.Errorf("counters of endpoint %d: no such endpoint", id)
	}
	return datapath.Counters{Drops: map[datapath.DropReason]uint64{}}, nil
}

func (m *MemoryDatapath) Close() error { return nil }

// Sweep forgets endpoints, VMs and socket slots that own does not list.
func (m *MemoryDatapath) Sweep(own datapath.Owned) (datapath.Swept, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var sw datapath.Swept
	for id := range m.eps {
		if !own.IDs[id] {
			delete(m.eps, id)
			sw.Endpoints++
		}
	}
	for id := range m.vms {
		if !own.VMs[id] {
			delete(m.vms, id)
			sw.VMLinks++
		}
	}
	for slot := range m.xsks {
		if !own.XSKSlots[slot] {
			delete(m.xsks, slot)
		}
	}
	return sw, nil
}
