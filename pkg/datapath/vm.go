package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
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
// link is updated in place). A VM whose backend receives through the kernel
// (SetVMRx) keeps that mode: an agent restart re-attaches what was there.
// The calling thread must be in the VM's network namespace: the kernel
// resolves the ifindex there.
func (l *Loader) AttachVM(vm VM) error {
	return l.attachVM(vm, nil)
}

// SetVMRx chooses how frames for vm reach its backend. kernel: no XDP program
// on the VM's device (so its veth peer keeps GSO and a 64 KiB TCP segment
// arrives whole), the backend's AF_PACKET sockets receive every frame (packet
// taps run before tcx ingress) and vm_rx_drop at tcx ingress drops it
// afterwards, so the VM netns' own stack never answers for the VM. Otherwise
// steer_vm (XDP) redirects each frame into the queue's AF_XDP socket. The drop
// is attached before the steering program goes (and the reverse), so no frame
// reaches the netns stack in between. The calling thread must be in the VM's
// network namespace.
func (l *Loader) SetVMRx(vm VM, kernel bool) error {
	return l.attachVM(vm, &kernel)
}

func (l *Loader) attachVM(vm VM, kernel *bool) error {
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
	if err := l.ensureVMRSS(spec, vm.ID); err != nil {
		return fmt.Errorf("attach vm %d: %w", vm.ID, err)
	}
	rxKernel := kernel != nil && *kernel
	if kernel == nil {
		_, err := os.Stat(filepath.Join(l.cfg.PinDir, vmRxPin(vm.ID)))
		rxKernel = err == nil
	}
	if rxKernel {
		if err := l.attach(vmRxPin(vm.ID), vm.IfIndex, attachTCXIngress, progs.VmRxDrop); err != nil {
			return fmt.Errorf("attach vm %d rx drop: %w", vm.ID, err)
		}
		if err := l.detach(vmPin(vm.ID)); err != nil {
			return fmt.Errorf("vm %d: %w", vm.ID, err)
		}
		return nil
	}
	if err := l.attach(vmPin(vm.ID), vm.IfIndex, attachXDPDriver, progs.SteerVm); err != nil {
		return fmt.Errorf("attach vm %d: %w", vm.ID, err)
	}
	if err := l.detach(vmRxPin(vm.ID)); err != nil {
		return fmt.Errorf("vm %d: %w", vm.ID, err)
	}
	return nil
}

// VMRxKernel reports whether vm receives through the kernel (SetVMRx).
func (l *Loader) VMRxKernel(vm VM) bool {
	_, err := os.Stat(filepath.Join(l.cfg.PinDir, vmRxPin(vm.ID)))
	return err == nil
}

// VMRSSValueSize is the size of struct lk_vm_rss_cfg (bpf/lib/vm_rss.h).
const VMRSSValueSize = 312

// VMRSS mirrors struct lk_vm_rss_cfg: a VM guest's RSS configuration as its
// backend writes it (lanekit-vhost rss.rs). HashTypes 0 is "no guest
// configuration": the flow-hash queue and no hash metadata.
type VMRSS struct {
	HashTypes         uint32 // VIRTIO_NET_RSS_HASH_TYPE_*
	Steer             uint16 // 1: the table picks the queue (RSS_CONFIG); 0: hash only (HASH_CONFIG)
	TableMask         uint16 // table entries - 1
	UnclassifiedQueue uint16
	Pad               uint16
	Seq               uint32   // odd while being rewritten
	Key               [40]byte // QEMU rss.bpf.c layout (see NewVMRSS)
	Table             [128]uint16
}

// NewVMRSS builds a steering configuration from a 40-byte Toeplitz key (in
// wire order), the enabled hash types and a power-of-two indirection table.
func NewVMRSS(key [40]byte, hashTypes uint32, table []uint16, unclassified uint16) (VMRSS, error) {
	n := len(table)
	if n == 0 || n > 128 || n&(n-1) != 0 {
		return VMRSS{}, fmt.Errorf("vm rss: indirection table of %d entries: want a power of two in 1..128", n)
	}
	c := VMRSS{HashTypes: hashTypes, Steer: 1, TableMask: uint16(n - 1), UnclassifiedQueue: unclassified}
	// QEMU layout: key bytes 0..3 as one host-order u32 of their big-endian value.
	binary.NativeEndian.PutUint32(c.Key[:4], binary.BigEndian.Uint32(key[:4]))
	copy(c.Key[4:], key[4:])
	copy(c.Table[:], table)
	return c, nil
}

// ensureVMRSS gives VM id its configuration map in lk_rss_vms, unless it has
// one (an agent restart keeps the map the backend may have mapped).
func (l *Loader) ensureVMRSS(spec *ebpf.CollectionSpec, id uint32) error {
	var inner *ebpf.Map
	err := l.vm.LkRssVms.Lookup(id, &inner)
	if err == nil {
		return inner.Close()
	}
	if !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("rss map: %w", err)
	}
	ms, ok := spec.Maps["lk_rss_vms"]
	if !ok || ms.InnerMap == nil {
		return fmt.Errorf("rss map: lk_rss_vms has no inner map spec")
	}
	is := ms.InnerMap.Copy()
	is.Name = "lk_vmrss_" + strconv.FormatUint(uint64(id), 10)
	if is.ValueSize != VMRSSValueSize {
		return fmt.Errorf("rss map: value size %d, Go side expects %d", is.ValueSize, VMRSSValueSize)
	}
	m, err := ebpf.NewMap(is)
	if err != nil {
		return fmt.Errorf("create rss map: %w", err)
	}
	defer m.Close()
	if err := l.vm.LkRssVms.Update(id, m, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return fmt.Errorf("publish rss map: %w", err)
	}
	return nil
}

// VMRSSMap returns vm's RSS configuration map (the caller closes it): the
// agent hands its fd to the VM's backend with the AF_XDP sockets.
func (l *Loader) VMRSSMap(vm VM) (*ebpf.Map, error) {
	var inner *ebpf.Map
	if err := l.vm.LkRssVms.Lookup(vm.ID, &inner); err != nil {
		return nil, fmt.Errorf("vm %d: rss map: %w", vm.ID, err)
	}
	return inner, nil
}

func vmPin(id uint32) string { return pinVMLink + strconv.FormatUint(uint64(id), 10) }

func vmRxPin(id uint32) string { return pinVMRxLink + strconv.FormatUint(uint64(id), 10) }

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
	for _, pin := range []string{vmPin(vm.ID), vmRxPin(vm.ID)} {
		if err := l.detach(pin); err != nil {
			return fmt.Errorf("detach vm %d: %w", vm.ID, err)
		}
	}
	if err := deleteIgnoreMissing(l.vm.LkRssVms, vm.ID); err != nil {
		return fmt.Errorf("detach vm %d: rss map: %w", vm.ID, err)
	}
	for q := 0; q < vm.Queues; q++ {
		if err := deleteIgnoreMissing(l.vm.LkXsks, vm.XSKBase+uint32(q)); err != nil {
			return fmt.Errorf("detach vm %d: socket slot %d: %w", vm.ID, q, err)
		}
	}
	return nil
}
