package agent

// VM endpoints: a pod endpoint whose device inside the VM's (virt-launcher
// pod's) netns has one rx/tx queue per VM queue pair, the steering program
// attached to it, and a unix socket where the vhost-user backend fetches the
// AF_XDP sockets bound to its queues (pkg/xsk's fd-passing protocol).

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/netdev"
	"github.com/lanekit/lanekit/pkg/store"
	"github.com/lanekit/lanekit/pkg/xsk"
)

// VMDatapath is the part of a datapath that serves VM endpoints;
// *datapath.Loader and the tests' agenttest.MemoryDatapath implement it.
type VMDatapath interface {
	// AttachVM must run in the VM's netns (the ifindex is resolved there).
	AttachVM(vm datapath.VM) error
	SetVMSocket(vm datapath.VM, queue int, fd int) error
	DetachVM(vm datapath.VM) error
}

var _ VMDatapath = (*datapath.Loader)(nil)

// VMRSSDatapath is a VM datapath that steers by the guest's RSS
// configuration: it has a map per VM that the backend writes (handed over
// with the sockets). Optional: without it backends get no map and offer no
// virtio RSS / hash report.
type VMRSSDatapath interface {
	VMRSSMap(vm datapath.VM) (*ebpf.Map, error)
}

var _ VMRSSDatapath = (*datapath.Loader)(nil)

const (
	// DefaultVMSocketDir is where the per-VM fd-passing sockets live.
	DefaultVMSocketDir = "/run/lanekit/vm"
	// MaxVMQueues bounds a VM's queue pairs.
	MaxVMQueues = 16
	// defaultVMMTU caps the default MTU of a VM device.
	defaultVMMTU = 1500
	// maxVMMTU: a copy-mode AF_XDP frame of 2 KiB holds 2048 - 256 bytes of
	// XDP headroom, Ethernet header included.
	maxVMMTU = 2048 - 256 - 14
	// maxSocketPath is sizeof(sun_path) minus the terminating NUL.
	maxSocketPath = 107
	// xskBusyWait bounds how long opening a VM's sockets retries EBUSY.
	xskBusyWait = 3 * time.Second
)

// AddVMRequest asks for a VM endpoint.
type AddVMRequest struct {
	Name   string
	Netns  string // path of the VM's network namespace
	Queues int    // queue pairs, 1..MaxVMQueues
	MAC    string // optional MAC of the VM's device; empty: random
	MTU    int    // 0: the agent's MTU capped at 1500
	// IfName is the VM's device in its netns; empty: endpoint.VMIfName
	// (eth0). A VM in a pod that has its own eth0 (KubeVirt's
	// virt-launcher) needs another name.
	IfName string
	Labels map[string]string
	// Owner of the fd-passing socket (the backend's user); nil: root.
	SocketUID, SocketGID *uint32
	// Live migration target (vmmigrate.go): Address is the VM's address on
	// the source (claimed, not allocated); Incoming keeps the endpoint
	// inactive until ActivateVM; Generation orders claims of the address;
	// GatewayMAC is the MAC the guest knows for its gateway. Address6 is a
	// dual-stack VM's IPv6 address on the source (claimed in this node's
	// IPv6 pool: native routing moves it too).
	Address    netip.Addr
	Address6   netip.Addr
	Incoming   bool
	Generation uint64
	GatewayMAC string

	// Set by AttachVM: the CNI attachment and the backend the agent runs;
	// allocUID: the backend gets its own uid (and gid), which also owns the
	// fd-passing socket.
	attachment *endpoint.CNIAttachment
	backend    *endpoint.VMBackend
	allocUID   bool
}

// VMInfo is a VM endpoint and whether its socket server runs.
type VMInfo struct {
	Endpoint endpoint.Endpoint
	Serving  bool
	// HandoverRefused counts connectors the VM's socket server refused for
	// their credentials (not root, not the VM's backend uid) since it started.
	HandoverRefused uint64
	// Backend is set when the agent runs the VM's backend.
	Backend *BackendInfo
}

// Values of Config.TxGSO (--tx-gso).
const (
	TxGSOKernel   = "kernel"
	TxGSOSoftware = "software"
)

// Values of Config.RxGSO (--rx-gso).
const (
	RxGSOKernel = "kernel"
	RxGSOXDP    = "xdp"
)

// VMRxDatapath is a VM datapath that can hand a VM's frames to its backend's
// AF_PACKET sockets instead of its AF_XDP sockets (datapath.Loader.SetVMRx).
// Optional: without it every VM receives through AF_XDP.
type VMRxDatapath interface {
	// SetVMRx must run in the VM's netns.
	SetVMRx(vm datapath.VM, kernel bool) error
}

var _ VMRxDatapath = (*datapath.Loader)(nil)

func vmKey(name string) string { return endpoint.Key(endpoint.VMContainerID(name), endpoint.VMIfName) }

func vmHostIf(name string) string {
	return endpoint.HostIfName(endpoint.VMContainerID(name), endpoint.VMIfName)
}

func (a *Agent) vmSocketPath(name string) string {
	return filepath.Join(a.cfg.VMSocketDir, name+".sock")
}

// vmDatapath returns the datapath's VM side, or an error if it has none.
func (a *Agent) vmDatapath() (VMDatapath, error) {
	vdp, ok := a.dp.(VMDatapath)
	if !ok {
		return nil, fmt.Errorf("the %s datapath has no vm fast lane: %w", a.backend, datapath.ErrNotSupported)
	}
	return vdp, nil
}

// validateAddVM checks req, fills defaults and returns the parsed MAC.
func (a *Agent) validateAddVM(req *AddVMRequest) (net.HardwareAddr, error) {
	if err := endpoint.ValidateVMName(req.Name); err != nil {
		return nil, fmt.Errorf("%w: %w", err, ErrInvalid)
	}
	if req.IfName == "" {
		req.IfName = endpoint.VMIfName
	}
	if err := endpoint.Validate(endpoint.VMContainerID(req.Name), req.IfName); err != nil {
		return nil, fmt.Errorf("%w: %w", err, ErrInvalid)
	}
	if req.Queues < 1 || req.Queues > MaxVMQueues {
		return nil, fmt.Errorf("%d queues out of range 1-%d: %w", req.Queues, MaxVMQueues, ErrInvalid)
	}
	if p := a.vmSocketPath(req.Name); len(p) > maxSocketPath {
		return nil, fmt.Errorf("socket path %s is longer than %d bytes: %w", p, maxSocketPath, ErrInvalid)
	}
	if req.MTU == 0 {
		req.MTU = min(a.mtu, defaultVMMTU)
	}
	if req.MTU < 68 || req.MTU > maxVMMTU {
		return nil, fmt.Errorf("mtu %d out of range 68-%d: %w", req.MTU, maxVMMTU, ErrInvalid)
	}
	var mac net.HardwareAddr
	if req.MAC != "" {
		var err error
		if mac, err = net.ParseMAC(req.MAC); err != nil {
			return nil, fmt.Errorf("mac %q: %w: %w", req.MAC, err, ErrInvalid)
		}
		if len(mac) != 6 || mac[0]&1 != 0 || string(mac) == string(make([]byte, 6)) {
			return nil, fmt.Errorf("mac %s is not a unicast Ethernet address: %w", mac, ErrInvalid)
		}
	}
	if err := validateIncoming(req); err != nil {
		return nil, err
	}
	if req.Netns == "" {
		return nil, fmt.Errorf("netns is empty: %w", ErrBadNetns)
	}
	if fi, err := os.Stat(req.Netns); err != nil {
		return nil, fmt.Errorf("netns %s: %w: %w", req.Netns, err, ErrBadNetns)
	} else if fi.IsDir() {
		return nil, fmt.Errorf("netns %s is a directory: %w", req.Netns, ErrBadNetns)
	}
	return mac, nil
}

// AddVM creates a VM endpoint. A taken name is ErrConflict. On failure
// everything done so far is undone.
func (a *Agent) AddVM(req AddVMRequest) (_ *VMInfo, err error) {
	defer func() {
		if err == nil {
			a.endpointsChanged()
		}
	}()
	mac, err := a.validateAddVM(&req)
	if err != nil {
		return nil, fmt.Errorf("add vm %s: %w", req.Name, err)
	}
	vdp, err := a.vmDatapath()
	if err != nil {
		return nil, fmt.Errorf("add vm %s: %w", req.Name, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	key := vmKey(req.Name)
	if ep, ok, err := a.lookup(key); err != nil {
		return nil, fmt.Errorf("add vm %s: %w", req.Name, err)
	} else if ok {
		return nil, fmt.Errorf("add vm %s: exists (endpoint %d in netns %s): %w", req.Name, ep.ID, ep.Netns, ErrConflict)
	}

	var undo undoStack
	defer func() { err = undo.unwind(err, a.log.With("vm", req.Name)) }()

	ep := endpoint.Endpoint{
		Kind: endpoint.KindVM, ContainerID: endpoint.VMContainerID(req.Name), IfName: req.IfName,
		Netns: req.Netns, Mode: datapath.ModeVeth, HostIfName: vmHostIf(req.Name), MTU: req.MTU,
		Labels: req.Labels, Created: time.Now().UTC(), Pending: true,
		VM: &endpoint.VM{Name: req.Name, Queues: req.Queues, Socket: a.vmSocketPath(req.Name), SocketUID: req.SocketUID, SocketGID: req.SocketGID,
			Attachment: req.attachment, Backend: req.backend, Migration: migrationOf(req)},
	}
	if ep.VM.NetnsCookie, ep.VM.NetnsIno, err = netnsIdentity(req.Netns); err != nil {
		return nil, fmt.Errorf("add vm %s: %w: %w", req.Name, err, ErrBadNetns)
	}
	// Intent first (see Add): a pending record owns the address, ID and slots.
	err = a.st.Update(func(tx *store.Tx) error {
		var err error
		if req.Address.IsValid() {
			if a.ipam == nil { // an IPv6-only node (ipv6.go)
				return fmt.Errorf("address %s: this node has no IPv4 pod CIDR: %w", req.Address, ErrInvalid)
			}
			if err := a.claimAddrTx(tx, key, req.Name, req.Address); err != nil {
				return err
			}
			ep.IP = req.Address
		} else if ep.IP, err = a.allocIPv4Tx(tx, key); err != nil { // ipv6.go
			return err
		}
		if req.Address6.IsValid() {
			if err := a.claimAddrTx(tx, key, req.Name, req.Address6); err != nil {
				return err
			}
			ep.IP6 = req.Address6
		} else if ep.IP6, err = a.allocIPv6Tx(tx, key); err != nil { // ipv6.go
			return err
		}
		if ep.ID, err = allocIDTx(tx, key); err != nil {
			return err
		}
		if ep.VM.XSKBase, err = allocSlotsTx(tx, key, req.Queues); err != nil {
			return err
		}
		if req.allocUID && ep.VM.Backend != nil {
			uid, err := allocBackendUIDTx(tx, a.vhostUIDRange())
			if err != nil {
				return err
			}
			b := *ep.VM.Backend
			b.UID, b.GID = uid, uid
			ep.VM.Backend = &b
			ep.VM.SocketUID, ep.VM.SocketGID = &b.UID, &b.GID
		}
		return tx.Put(store.Endpoints, []byte(key), ep)
	})
	if err != nil {
		return nil, fmt.Errorf("add vm %s: %w", req.Name, err)
	}
	undo = append(undo, func() error { return a.forget(key, ep.ID) })
	crashAt(StepIntent)

	// A device with our name and no record is left from a crash mid-ADD.
	if err := a.host.DeletePod(ep.HostIfName); err != nil {
		return nil, fmt.Errorf("add vm %s: remove stale device: %w", req.Name, err)
	}
	links, err := a.host.SetupPod(netdev.PodSpec{
		Mode: datapath.ModeVeth, HostIfName: ep.HostIfName, IfName: ep.IfName, Netns: req.Netns,
		IP: ep.IP, IP6: ep.IP6, MTU: req.MTU, Queues: req.Queues, MAC: mac,
		// A device not named eth0 sits beside the pod's own (KubeVirt's
		// virt-launcher): the pod keeps its routes.
		NoRoutes: req.IfName != endpoint.VMIfName,
	})
	if err != nil {
		return nil, fmt.Errorf("add vm %s: %w", req.Name, err)
	}
	undo = append(undo, func() error { return a.host.DeletePod(ep.HostIfName) })
	crashAt(StepDevice)
	ep.HostIfIndex, ep.HostMAC, ep.IfIndex, ep.MAC = links.HostIfIndex, links.HostMAC.String(), links.IfIndex, links.MAC.String()
	if req.Incoming {
		// Inactive until the guest runs here: no route, no forwarding.
		if err := a.prepareIncoming(&ep, req.GatewayMAC); err != nil {
			return nil, fmt.Errorf("add vm %s: %w", req.Name, err)
		}
		undo = append(undo, func() error { return a.delIncomingDrops(&ep) })
		if err := a.addIncomingDrops(&ep); err != nil { // vmincoming.go
			return nil, fmt.Errorf("add vm %s: %w", req.Name, err)
		}
	}
	if err := a.st.Update(func(tx *store.Tx) error { return tx.Put(store.Endpoints, []byte(key), ep) }); err != nil {
		return nil, fmt.Errorf("add vm %s: record devices: %w", req.Name, err)
	}
	crashAt(StepRecorded)

	if !req.Incoming {
		dpEp, err := a.dpEndpoint(&ep)
		if err != nil {
			return nil, fmt.Errorf("add vm %s: %w", req.Name, err)
		}
		if err := a.host.Do(func() error { return a.dp.UpsertEndpoint(dpEp) }); err != nil {
			return nil, fmt.Errorf("add vm %s: program datapath: %w", req.Name, err)
		}
		undo = append(undo, func() error { return a.host.Do(func() error { return a.dp.DeleteEndpoint(dpEp) }) })
	}
	crashAt(StepDatapath)

	dvm, _, err := ep.DatapathVM()
	if err != nil {
		return nil, fmt.Errorf("add vm %s: %w", req.Name, err)
	}
	if err := netdev.InNetns(req.Netns, func() error { return vdp.AttachVM(dvm) }); err != nil {
		return nil, fmt.Errorf("add vm %s: %w", req.Name, err)
	}
	undo = append(undo, func() error { return vdp.DetachVM(dvm) })
	crashAt(StepVMAttach)

	if err := a.serveVM(&ep, dvm, vdp); err != nil {
		return nil, fmt.Errorf("add vm %s: %w", req.Name, err)
	}
	undo = append(undo, func() error { return a.stopVMServer(req.Name) })

	ep.Pending = false
	if err := a.st.Update(func(tx *store.Tx) error { return tx.Put(store.Endpoints, []byte(key), ep) }); err != nil {
		return nil, fmt.Errorf("add vm %s: store endpoint: %w", req.Name, err)
	}
	crashAt(StepCommitted)
	a.log.Info("vm added", "vm", req.Name, "id", ep.ID, "ip", ep.IP, "ip6", ep.IP6, "mac", ep.MAC, "queues", req.Queues,
		"xsk_base", ep.VM.XSKBase, "socket", ep.VM.Socket, "dev", ep.HostIfName)
	return &VMInfo{Endpoint: ep, Serving: true}, nil
}

// serveVM starts the fd-passing server of ep. Each backend connection gets
// fresh sockets, opened in the VM's netns and published in the datapath.
func (a *Agent) serveVM(ep *endpoint.Endpoint, dvm datapath.VM, vdp VMDatapath) error {
	// The directory can be traversed but not listed: each socket is 0600 and
	// owned by its VM's backend user.
	dir := filepath.Dir(ep.VM.Socket)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return fmt.Errorf("vm socket dir: %w", err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return fmt.Errorf("vm socket dir: %w", err)
	}
	name, netnsPath := ep.VM.Name, ep.Netns
	var rssMap xsk.RSSProvider
	if rdp, ok := vdp.(VMRSSDatapath); ok {
		rssMap = func() (int, int, error) {
			m, err := rdp.VMRSSMap(dvm)
			if err != nil {
				return -1, 0, err
			}
			defer m.Close()
			fd, err := unix.Dup(m.FD())
			if err != nil {
				return -1, 0, fmt.Errorf("vm %s rss map: %w", name, err)
			}
			return fd, int(m.ValueSize()), nil
		}
	}
	_, rxSteered := vdp.(VMRxDatapath)
	srv, err := xsk.ListenRSS(ep.VM.Socket, name, func(req xsk.Request) ([]*xsk.Socket, error) {
		var socks []*xsk.Socket
		var rxKernel bool
		err := netdev.InNetns(netnsPath, func() error {
			var err error
			// The kernel frees a closed socket's UMEM from a workqueue: a
			// backend reconnecting at once finds its queues busy for a moment.
			for deadline := time.Now().Add(xskBusyWait); ; time.Sleep(20 * time.Millisecond) {
				socks, err = xsk.OpenQueues(dvm.IfIndex, dvm.Queues, xsk.SizesFor(req))
				if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
					break
				}
			}
			if err != nil {
				return err
			}
			for q, s := range socks {
				if err := vdp.SetVMSocket(dvm, q, s.FD); err != nil {
					xsk.CloseAll(socks)
					return err
				}
			}
			if req.TxGSO && a.cfg.TxGSO != TxGSOSoftware {
				// Without them the backend cuts the frames itself: slower, not broken.
				if err := xsk.AddGSO(socks, dvm.IfIndex); err != nil {
					a.log.Warn("vm gso sockets: the backend segments in software", "vm", name, "err", err)
				}
			}
			rxKernel, err = a.setVMRx(req, socks, dvm, vdp)
			return err
		})
		if err == nil && rxSteered {
			// The host end is in the node's netns.
			err = a.host.Do(func() error { return netdev.SetTxChecksum(ep.HostIfName, rxKernel) })
			if err == nil {
				err = a.host.SetBIGTCP(ep.HostIfName, a.vmRxBIGTCP(rxKernel))
			}
		}
		if err != nil {
			xsk.CloseAll(socks)
			return nil, fmt.Errorf("vm %s sockets: %w", name, err)
		}
		return socks, nil
	}, rssMap, a.log)
	if err != nil {
		return err
	}
	if ep.VM.SocketUID != nil || ep.VM.SocketGID != nil {
		uid, gid := -1, -1
		if ep.VM.SocketUID != nil {
			uid = int(*ep.VM.SocketUID)
		}
		if ep.VM.SocketGID != nil {
			gid = int(*ep.VM.SocketGID)
		}
		if err := os.Chown(ep.VM.Socket, uid, gid); err != nil {
			srv.Close()
			return fmt.Errorf("vm %s socket owner: %w", name, err)
		}
		if uid > 0 {
			srv.SetPeerUID(uint32(uid))
		}
	}
	a.vms[name] = srv
	return nil
}

// setVMRx gives socks wire -> guest packet sockets when the backend asked
// (req.RxGSO) and the agent runs with --rx-gso kernel, and steers the VM's
// frames to whichever sockets the backend gets: without packet sockets (an
// older backend, --rx-gso xdp, or a failure to open them) steer_vm and the
// AF_XDP sockets, as always. It reports whether the VM now receives through
// the kernel: the caller then turns the host end's transmit checksum offload
// on (with it TSO, so GSO packets cross the veth whole and the backend gets
// partial checksums it hands on or fills), else off (AF_XDP copy mode would
// hand a guest partial checksums). Runs in the VM's netns.
func (a *Agent) setVMRx(req xsk.Request, socks []*xsk.Socket, dvm datapath.VM, vdp VMDatapath) (bool, error) {
	rdp, ok := vdp.(VMRxDatapath)
	if !ok {
		return false, nil
	}
	kernel := req.RxGSO && a.cfg.RxGSO == RxGSOKernel
	if kernel {
		if err := xsk.AddRxGSO(socks, dvm.IfIndex); err != nil {
			a.log.Warn("vm rx packet sockets: the backend receives through AF_XDP", "vm", req.VM, "err", err)
			kernel = false
		}
	}
	return kernel, rdp.SetVMRx(dvm, kernel)
}

// stopVMServer stops name's socket server if it runs (mu held).
func (a *Agent) stopVMServer(name string) error {
	srv, ok := a.vms[name]
	if !ok {
		return nil
	}
	delete(a.vms, name)
	if err := srv.Close(); err != nil {
		return fmt.Errorf("stop vm %s socket server: %w", name, err)
	}
	return nil
}

// detachVM removes ep's steering program and socket slots: inside its netns
// if that still exists, else from here (the datapath only unpins and clears
// map entries then). Errors are logged.
func (a *Agent) detachVM(ep *endpoint.Endpoint) {
	if ep.VM == nil {
		return
	}
	vdp, err := a.vmDatapath()
	if err != nil {
		return
	}
	dvm, _, err := ep.DatapathVM()
	if err != nil {
		a.log.Warn("detach vm", "vm", ep.VM.Name, "err", err)
		return
	}
	if _, serr := os.Stat(ep.Netns); serr == nil {
		err = netdev.InNetns(ep.Netns, func() error { return vdp.DetachVM(dvm) })
	} else {
		err = vdp.DetachVM(dvm)
	}
	if err != nil {
		a.log.Warn("detach vm", "vm", ep.VM.Name, "err", err)
	}
	if err := os.Remove(ep.VM.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		a.log.Warn("remove vm socket", "vm", ep.VM.Name, "err", err)
	}
}

// DelVM removes the VM endpoint name: its socket server, the steering
// program and registration, then the endpoint like a pod's. Unknown names, a
// missing netns and missing devices are success; existed reports whether
// there was a record.
func (a *Agent) DelVM(name string) (existed bool, err error) {
	defer func() {
		if err == nil {
			a.endpointsChanged()
		}
	}()
	if err := endpoint.ValidateVMName(name); err != nil {
		return false, fmt.Errorf("del vm: %w: %w", err, ErrInvalid)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.delVM(name)
}

// delVM is DelVM with mu held.
func (a *Agent) delVM(name string) (existed bool, err error) {
	key := vmKey(name)
	a.stopSourceWatchLocked(name, "") // vmhandover.go
	if err := a.stopVMServer(name); err != nil {
		return false, fmt.Errorf("del vm %s: %w", name, err)
	}
	ep, ok, err := a.lookup(key)
	if err != nil {
		return false, fmt.Errorf("del vm %s: %w", name, err)
	}
	if ok {
		if ep.VM == nil {
			return true, fmt.Errorf("del vm %s: record %s has no vm part: %w", name, key, ErrConflict)
		}
		a.stopVMBackend(&ep)
		if err := a.delIncomingDrops(&ep); err != nil {
			return true, fmt.Errorf("del vm %s: %w", name, err)
		}
		vdp, err := a.vmDatapath()
		if err != nil {
			return true, fmt.Errorf("del vm %s: %w", name, err)
		}
		dvm, _, err := ep.DatapathVM()
		if err != nil {
			return true, fmt.Errorf("del vm %s: %w", name, err)
		}
		if _, serr := os.Stat(ep.Netns); serr == nil {
			err = netdev.InNetns(ep.Netns, func() error { return vdp.DetachVM(dvm) })
		} else {
			err = vdp.DetachVM(dvm) // netns gone: see detachVM
		}
		if err != nil {
			return true, fmt.Errorf("del vm %s: %w", name, err)
		}
	}
	if err := os.Remove(a.vmSocketPath(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return ok, fmt.Errorf("del vm %s: remove socket: %w", name, err)
	}
	if _, err := a.del(key, vmHostIf(name)); err != nil {
		return ok, fmt.Errorf("del vm %s: %w", name, err)
	}
	if ok {
		a.log.Info("vm deleted", "vm", name, "id", ep.ID)
	}
	return ok, nil
}

// vmInfo is ep with whether its socket server runs and, when the agent runs
// it, its backend (mu held).
func (a *Agent) vmInfo(ep endpoint.Endpoint) VMInfo {
	srv, serving := a.vms[ep.VM.Name]
	vi := VMInfo{Endpoint: ep, Serving: serving}
	if serving {
		vi.HandoverRefused = srv.Refused()
	}
	if p, ok := a.backends[ep.VM.Name]; ok {
		bi := p.info()
		vi.Backend = &bi
	}
	return vi
}

// ListVMs returns every VM endpoint, by ID.
func (a *Agent) ListVMs() ([]VMInfo, error) {
	eps, err := a.endpoints()
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []VMInfo
	for _, ep := range eps {
		if ep.Kind != endpoint.KindVM || ep.VM == nil || ep.Pending {
			continue
		}
		out = append(out, a.vmInfo(ep))
	}
	return out, nil
}

// adoptVM re-attaches a stored VM after a restart (the pinned link is
// updated in place) and serves its socket again. Its device must still be
// in the same netns (by cookie or inode: the path may now name another
// namespace, and ifindexes repeat across namespaces) under the stored
// ifindex, name and MAC.
func (a *Agent) adoptVM(ep *endpoint.Endpoint) error {
	if ep.VM == nil {
		return fmt.Errorf("record %s has no vm part", ep.Key())
	}
	vdp, err := a.vmDatapath()
	if err != nil {
		return err
	}
	dvm, _, err := ep.DatapathVM()
	if err != nil {
		return err
	}
	cookie, ino, err := netnsIdentity(ep.Netns)
	if err != nil {
		return err
	}
	if ep.VM.NetnsCookie != 0 && cookie != 0 && cookie != ep.VM.NetnsCookie || ep.VM.NetnsIno != 0 && ino != ep.VM.NetnsIno {
		return fmt.Errorf("netns %s is another namespace now (cookie %d inode %d, recorded %d %d)",
			ep.Netns, cookie, ino, ep.VM.NetnsCookie, ep.VM.NetnsIno)
	}
	err = netdev.InNetns(ep.Netns, func() error {
		l, err := net.InterfaceByIndex(ep.IfIndex)
		if err != nil {
			return fmt.Errorf("device %d: %w", ep.IfIndex, err)
		}
		if l.Name != ep.IfName || l.HardwareAddr.String() != ep.MAC {
			return fmt.Errorf("device %d is %s %s, not %s %s", ep.IfIndex, l.Name, l.HardwareAddr, ep.IfName, ep.MAC)
		}
		return vdp.AttachVM(dvm)
	})
	if err != nil {
		return err
	}
	if ep.VM.Backend == nil && a.xsksEmptied() { // agent-run backends are restarted (vhostproc.go)
		a.log.Warn("lk_xsks was recreated in a new shape: this VM's backend, not run by the agent, receives nothing until it fetches its sockets again (restart it)",
			"vm", ep.VM.Name)
	}
	if err := a.serveVM(ep, dvm, vdp); err != nil {
		return err
	}
	a.watchGuestIfIncoming(ep) // a migration target when the agent restarted
	return nil
}

// netnsIdentity returns the netns cookie (0 when the kernel has none) and
// the nsfs inode of the namespace at path.
func netnsIdentity(path string) (cookie, ino uint64, err error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, 0, fmt.Errorf("netns %s: %w", path, err)
	}
	err = netdev.InNetns(path, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("socket in netns: %w", err)
		}
		defer unix.Close(fd)
		c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		if err == nil {
			cookie = c
		} else if !errors.Is(err, unix.ENOPROTOOPT) {
			return fmt.Errorf("netns cookie: %w", err)
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	return cookie, st.Ino, nil
}
