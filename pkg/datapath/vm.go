package datapath

import (
	"fmt"
	"net"
	"strconv"

	"github.com/cilium/ebpf"
)

// MaxXSKs is the number of AF_XDP socket slots shared by all VMs of a node.
const MaxXSKs = 1024

// VM is a VM endpoint as the fast lane sees it: the endpoint device in the
// VM's pod netns, where its AF_XDP sockets are bound, one per queue.
type VM struct {
	ID      uint32           // the VM's endpoint id
	IfIndex int              // endpoint device ifindex, in the VM's netns
	MAC     net.HardwareAddr // the VM's MAC (= the endpoint's MAC)
	Queues  int              // queue pairs
	XSKBase uint32           // first slot in lk_xsks; slots XSKBase..XSKBase+Queues-1
}

func (vm VM) validate() error {
	switch {
	case vm.ID == 0:
		return fmt.Errorf("vm endpoint id must be > 0")
	case vm.IfIndex <= 0:
		return fmt.Errorf("vm %d: bad ifindex %d", vm.ID, vm.IfIndex)
	case len(vm.MAC) != 6:
		return fmt.Errorf("vm %d: MAC must be 6 bytes", vm.ID)
	case vm.Queues < 1 || vm.Queues > 256:
		return fmt.Errorf("vm %d: %d queues (1..256)", vm.ID, vm.Queues)
	case int(vm.XSKBase)+vm.Queues > MaxXSKs:
		return fmt.Errorf("vm %d: socket slots %d..%d beyond %d", vm.ID, vm.XSKBase, int(vm.XSKBase)+vm.Queues-1, MaxXSKs)
	}
	return nil
}

// AttachVM loads a steering program for vm (its identity set at load time)
// and attaches it to the VM's device (native XDP, pinned link; an existing
// link is updated in place). The calling thread must be in the VM's network
// namespace: the kernel resolves the ifindex there.
func (l *Loader) AttachVM(vm VM) error {
	if err := vm.validate(); err != nil {
		return fmt.Errorf("attach vm: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	spec, err := loadVm()
	if err != nil {
		return fmt.Errorf("attach vm %d: %w", vm.ID, err)
	}
	sizeMetrics(spec)
	var mac [6]byte
	copy(mac[:], vm.MAC)
	for name, v := range map[string]any{
		"vm_id": vm.ID, "vm_xsk_base": vm.XSKBase, "vm_queues": uint32(vm.Queues), "vm_mac": mac,
		"trace_redirects": boolToU8(l.cfg.traceRedirects),
	} {
		if err := spec.Variables[name].Set(v); err != nil {
			return fmt.Errorf("attach vm %d: set %s: %w", vm.ID, name, err)
		}
	}
	var progs vmPrograms
	if err := spec.LoadAndAssign(&progs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: l.cfg.PinDir}}); err != nil {
		return fmt.Errorf("attach vm %d: load: %w", vm.ID, err)
	}
	defer progs.Close() // the pinned link holds the program
	if err := l.attach(vmPin(vm.ID), vm.IfIndex, attachXDPDriver, progs.SteerVm); err != nil {
		return fmt.Errorf("attach vm %d: %w", vm.ID, err)
	}
	return nil
}

func vmPin(id uint32) string { return pinVMLink + strconv.FormatUint(uint64(id), 10) }

// SetVMSocket publishes an AF_XDP socket fd as queue's socket of vm.
func (l *Loader) SetVMSocket(vm VM, queue int, fd int) error {
	if queue < 0 || queue >= vm.Queues {
		return fmt.Errorf("vm %d: queue %d out of range", vm.ID, queue)
	}
	if err := l.vm.LkXsks.Put(vm.XSKBase+uint32(queue), uint32(fd)); err != nil {
		return fmt.Errorf("vm %d: publish socket of queue %d: %w", vm.ID, queue, err)
	}
	return nil
}

// DetachVM removes the steering program and the VM's socket slots. What is
// already gone is not an error.
func (l *Loader) DetachVM(vm VM) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.detach(vmPin(vm.ID)); err != nil {
		return fmt.Errorf("detach vm %d: %w", vm.ID, err)
	}
	for q := 0; q < vm.Queues; q++ {
		if err := deleteIgnoreMissing(l.vm.LkXsks, vm.XSKBase+uint32(q)); err != nil {
			return fmt.Errorf("detach vm %d: socket slot %d: %w", vm.ID, q, err)
		}
	}
	return nil
}
