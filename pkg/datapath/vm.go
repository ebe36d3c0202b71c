package datapath

import (
	"fmt"
	"net"
	"strconv"
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

// AttachVM attaches the steering program to the VM's device (native XDP,
// pinned link) and registers the VM. The calling thread must be in the VM's
// network namespace: the kernel resolves the ifindex there.
func (l *Loader) AttachVM(vm VM) error {
	if err := vm.validate(); err != nil {
		return fmt.Errorf("attach vm: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	info := vmVmInfo{Id: vm.ID, XskBase: vm.XSKBase, Queues: uint32(vm.Queues)}
	copy(info.Mac[:], vm.MAC)
	if err := l.vm.LkVms.Put(uint32(vm.IfIndex), info); err != nil {
		return fmt.Errorf("attach vm %d: register: %w", vm.ID, err)
	}
	if err := l.attach(vmPin(vm.ID), vm.IfIndex, attachXDPDriver, l.vm.SteerVm); err != nil {
		deleteIgnoreMissing(l.vm.LkVms, uint32(vm.IfIndex))
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

// DetachVM removes the steering program, the registration and the VM's
// socket slots. What is already gone is not an error.
func (l *Loader) DetachVM(vm VM) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.detach(vmPin(vm.ID)); err != nil {
		return fmt.Errorf("detach vm %d: %w", vm.ID, err)
	}
	if vm.IfIndex > 0 {
		if err := deleteIgnoreMissing(l.vm.LkVms, uint32(vm.IfIndex)); err != nil {
			return fmt.Errorf("detach vm %d: %w", vm.ID, err)
		}
	}
	for q := 0; q < vm.Queues; q++ {
		if err := deleteIgnoreMissing(l.vm.LkXsks, vm.XSKBase+uint32(q)); err != nil {
			return fmt.Errorf("detach vm %d: socket slot %d: %w", vm.ID, q, err)
		}
	}
	return nil
}
