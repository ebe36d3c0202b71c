package datapath

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Pin names under Config.PinDir. Maps pin themselves by name (lk_endpoints,
// lk_ep_by_ifindex, lk_metrics); links pin under these names.
const (
	pinUplinkTC     = "lk_uplink_tc"
	pinUplinkEgress = "lk_uplink_egress" // to_uplink: service replies of the node's stack
	pinHostPF       = "lk_hostpf_tc"     // from_host on a DPU's host-facing PF representor
	pinPodLink      = "lk_pod_"          // + host-side ifname
	pinToPod        = "lk_topod_"        // + host-side ifname: to_pod
	pinVMLink       = "lk_vm_"           // + endpoint id
	pinVMRxLink     = "lk_vmrx_"         // + endpoint id: vm_rx_drop (SetVMRx kernel)
)

// Loader is the BPF implementation of Datapath.
type Loader struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	pod    podObjects
	uplink uplinkObjects
	vm     vmMaps    // lk_xsks; each VM gets its own steer_vm instance (AttachVM)
	sock   *sockMaps // the socket LB's maps, after AttachSockLB (sock.go)
	// emptied: pinned maps replaced with empty ones of a new shape at
	// load (migrate.go).
	emptied []string
}

var _ Datapath = (*Loader)(nil)

// Open loads the programs, re-adopting the maps pinned in cfg.PinDir (so the
// endpoints and counters of a previous agent stay), and attaches the uplink
// program to cfg.Uplink. Links already pinned are updated in place to the
// new programs: no duplicate attachment, no gap in forwarding.
func Open(cfg Config, log *slog.Logger) (*Loader, error) {
	if log == nil {
		log = slog.Default()
	}
	if !cfg.GatewayIP.IsValid() {
		cfg.GatewayIP = DefaultGatewayIP
	}
	if !cfg.GatewayIP.Is4() {
		return nil, fmt.Errorf("open datapath: gateway %s is not IPv4", cfg.GatewayIP)
	}
	if err := os.MkdirAll(cfg.PinDir, 0o700); err != nil {
		return nil, fmt.Errorf("open datapath: create pin dir: %w", err)
	}
	l := &Loader{cfg: cfg, log: log}
	if err := l.load(); err != nil {
		return nil, fmt.Errorf("open datapath: %w", err)
	}
	if cfg.Uplink != "" {
		ifc, err := net.InterfaceByName(cfg.Uplink)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("open datapath: uplink %q: %w", cfg.Uplink, err)
		}
		if err := l.attach(pinUplinkTC, ifc.Index, attachTCXIngress, l.uplink.FromUplink); err != nil {
			l.Close()
			return nil, fmt.Errorf("open datapath: uplink %s: %w", cfg.Uplink, err)
		}
		if err := l.attach(pinUplinkEgress, ifc.Index, attachTCXEgress, l.uplink.ToUplink); err != nil {
			l.Close()
			return nil, fmt.Errorf("open datapath: uplink %s egress: %w", cfg.Uplink, err)
		}
	}
	if err := l.attachTunnel(); err != nil {
		l.Close()
		return nil, fmt.Errorf("open datapath: %w", err)
	}
	// A DPU's host PF representor: from_host; without one, a link an
	// earlier agent pinned is removed.
	var hostPFErr error
	if cfg.HostPF == "" {
		hostPFErr = l.detach(pinHostPF)
	} else {
		var ifc *net.Interface
		if ifc, hostPFErr = net.InterfaceByName(cfg.HostPF); hostPFErr == nil {
			hostPFErr = l.attach(pinHostPF, ifc.Index, attachTCXIngress, l.uplink.FromHost) // in place on a restart
		}
	}
	if hostPFErr != nil {
		l.Close()
		return nil, fmt.Errorf("open datapath: host PF %q: %w", cfg.HostPF, hostPFErr)
	}
	log.Info("datapath loaded", "pin_dir", cfg.PinDir, "uplink", cfg.Uplink, "gateway", cfg.GatewayIP, "tunnel", cfg.Tunnel)
	return l, nil
}

func (l *Loader) load() error {
	gw := l.cfg.GatewayIP.As4()
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: l.cfg.PinDir}}

	podSpec, err := loadPod()
	if err != nil {
		return err
	}
	sizeMetrics(podSpec)
	if err := sizeConntrack(podSpec, l.ctEntries()); err != nil {
		return err
	}
	snatLo, snatHi, err := l.cfg.snatPorts()
	if err != nil {
		return err
	}
	if err := setSNATPorts(podSpec, snatLo, snatHi); err != nil {
		return err
	}
	// gateway_ip is __be32: its in-memory bytes are the address in network order.
	if err := podSpec.Variables["gateway_ip"].Set(gw); err != nil {
		return fmt.Errorf("set gateway_ip: %w", err)
	}
	if err := podSpec.Variables["trace_redirects"].Set(boolToU8(l.cfg.traceRedirects)); err != nil {
		return fmt.Errorf("set trace_redirects: %w", err)
	}
	tun, err := l.cfg.tunnelDevice()
	if err != nil {
		return err
	}
	if err := setTunnel(podSpec, tun); err != nil {
		return err
	}
	if err := l.migrate(podSpec); err != nil {
		return err
	}
	if err := podSpec.LoadAndAssign(&l.pod, opts); err != nil {
		return fmt.Errorf("load pod programs: %w", mapIncompatibleHint(err, l.cfg.PinDir))
	}
	// from_pod's IPv6 half, entered by a tail call (bpf/lib/ipv6.h).
	if err := l.pod.LkPod6Progs.Put(uint32(0), l.pod.FromPod6); err != nil {
		l.pod.Close()
		return fmt.Errorf("install from_pod6: %w", err)
	}

	upSpec, err := loadUplink()
	if err != nil {
		l.pod.Close()
		return err
	}
	sizeMetrics(upSpec)
	if err := sizeConntrack(upSpec, l.ctEntries()); err != nil {
		l.pod.Close()
		return err
	}
	if err := setSNATPorts(upSpec, snatLo, snatHi); err != nil {
		l.pod.Close()
		return err
	}
	if err := upSpec.Variables["trace_redirects"].Set(boolToU8(l.cfg.traceRedirects)); err != nil {
		l.pod.Close()
		return fmt.Errorf("set trace_redirects: %w", err)
	}
	if err := setTunnel(upSpec, tun); err != nil {
		l.pod.Close()
		return err
	}
	if err := l.migrate(upSpec); err != nil {
		l.pod.Close()
		return err
	}
	if err := upSpec.LoadAndAssign(&l.uplink, opts); err != nil {
		l.pod.Close()
		return fmt.Errorf("load uplink programs: %w", mapIncompatibleHint(err, l.cfg.PinDir))
	}
	// from_wire's IPv6 half, entered by a tail call (bpf/lib/ipv6.h).
	if err := l.uplink.LkUplink6Progs.Put(uint32(0), l.uplink.FromUplink6); err != nil {
		l.pod.Close()
		l.uplink.Close()
		return fmt.Errorf("install from_uplink6: %w", err)
	}

	vmSpec, err := loadVm()
	if err == nil {
		sizeMetrics(vmSpec)
		if err = l.migrate(vmSpec); err == nil {
			err = vmSpec.LoadAndAssign(&l.vm, opts)
		}
	}
	if err != nil {
		l.pod.Close()
		l.uplink.Close()
		return fmt.Errorf("load vm programs: %w", mapIncompatibleHint(err, l.cfg.PinDir))
	}
	// Flow events start off: a previous agent may have died with them on,
	// and nobody reads them until someone observes.
	if err := l.pod.LkEventsCfg.Put(uint32(0), podEventsCfg{}); err != nil {
		l.pod.Close()
		l.uplink.Close()
		l.vm.Close()
		return fmt.Errorf("turn flow events off: %w", err)
	}
	return nil
}

// ctEntries is lk_ct4's size (Config.ConntrackEntries or the default).
func (l *Loader) ctEntries() uint32 {
	if l.cfg.ConntrackEntries > 0 {
		return uint32(l.cfg.ConntrackEntries)
	}
	return DefaultConntrackEntries
}

func mapIncompatibleHint(err error, dir string) error {
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		return fmt.Errorf("%w (maps pinned in %s come from an incompatible version; remove them to start fresh)", err, dir)
	}
	return err
}

func boolToU8(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// attach makes prog the program behind the link pinned as pin on ifindex:
// an existing pinned link on the same device is updated in place; a stale one
// (device gone or recreated) is unpinned and a new link attached and pinned.
func (l *Loader) attach(pin string, ifindex int, mode attachMode, prog *ebpf.Program) error {
	path := filepath.Join(l.cfg.PinDir, pin)
	if old, err := link.LoadPinnedLink(path, nil); err == nil {
		if linkIfindex(old) == ifindex {
			err := old.Update(prog)
			old.Close()
			if err == nil {
				return nil
			}
			l.log.Warn("pinned link update failed, re-attaching", "pin", pin, "err", err)
			if old, err = link.LoadPinnedLink(path, nil); err != nil {
				return fmt.Errorf("reload pinned link %s: %w", pin, err)
			}
		}
		if err := old.Unpin(); err != nil {
			old.Close()
			return fmt.Errorf("unpin stale link %s: %w", pin, err)
		}
		old.Close()
	}

	var (
		lnk link.Link
		err error
	)
	switch mode {
	case attachNetkitPeer:
		lnk, err = link.AttachNetkit(link.NetkitOptions{Interface: ifindex, Program: prog, Attach: ebpf.AttachNetkitPeer})
	case attachNetkitPrimary:
		lnk, err = link.AttachNetkit(link.NetkitOptions{Interface: ifindex, Program: prog, Attach: ebpf.AttachNetkitPrimary})
	case attachTCXEgress:
		lnk, err = link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: ebpf.AttachTCXEgress})
	case attachXDPDriver:
		lnk, err = link.AttachXDP(link.XDPOptions{Interface: ifindex, Program: prog, Flags: link.XDPDriverMode})
	default:
		lnk, err = link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: ebpf.AttachTCXIngress})
	}
	if err != nil {
		if errors.Is(err, ebpf.ErrNotSupported) {
			return fmt.Errorf("attach %s to ifindex %d: %w", mode, ifindex, ErrNotSupported)
		}
		return fmt.Errorf("attach %s to ifindex %d: %w", mode, ifindex, err)
	}
	defer lnk.Close()
	if err := lnk.Pin(path); err != nil {
		return fmt.Errorf("pin link %s: %w", pin, err)
	}
	return nil
}

// attachMode is how a program hooks into a device.
type attachMode int

const (
	attachTCXIngress    attachMode = iota // tcx ingress: veth host ends, the uplink
	attachNetkitPeer                      // netkit peer program: runs for what the pod sends
	attachXDPDriver                       // native XDP: VM devices
	attachTCXEgress                       // tcx egress: veth host ends (what the stack sends into a pod)
	attachNetkitPrimary                   // netkit primary program: runs for what is sent into the pod
)

func (m attachMode) String() string {
	return [...]string{"tcx", "netkit", "xdp", "tcx-egress", "netkit-primary"}[m]
}

// podAttachMode is how the pod program attaches for a device mode.
func podAttachMode(m DeviceMode) attachMode {
	if m.Netkit() {
		return attachNetkitPeer
	}
	return attachTCXIngress
}

// toPodAttachMode is how to_pod attaches: on the path the host stack takes
// into the pod.
func toPodAttachMode(m DeviceMode) attachMode {
	if m.Netkit() {
		return attachNetkitPrimary
	}
	return attachTCXEgress
}

// linkIfindex returns the device a tcx/netkit link is attached to, or 0 when
// it is detached (its device was deleted).
func linkIfindex(l link.Link) int {
	info, err := l.Info()
	if err != nil {
		return 0
	}
	if tcx := info.TCX(); tcx != nil {
		return int(tcx.Ifindex)
	}
	if nk := info.Netkit(); nk != nil {
		return int(nk.Ifindex)
	}
	if x := info.XDP(); x != nil {
		return int(x.Ifindex)
	}
	return 0
}

// detach unpins (and so releases) the link pinned as pin; missing is fine.
func (l *Loader) detach(pin string) error {
	path := filepath.Join(l.cfg.PinDir, pin)
	lnk, err := link.LoadPinnedLink(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		// Not a loadable link (e.g. left over from a crash mid-pin): drop the file.
		if rmErr := os.Remove(path); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
			return fmt.Errorf("remove pin %s: %w", pin, rmErr)
		}
		return nil
	}
	defer lnk.Close()
	if err := lnk.Unpin(); err != nil {
		return fmt.Errorf("unpin %s: %w", pin, err)
	}
	return nil
}

// Close releases the agent's handles. Pinned maps and links stay and keep
// forwarding.
func (l *Loader) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	errs := []error{l.pod.Close(), l.uplink.Close(), l.vm.Close()}
	if l.sock != nil {
		errs = append(errs, l.sock.Close())
	}
	return errors.Join(errs...)
}

// Unpin removes everything pinned in the pin directory: links (detaching the
// programs) and maps. Used by `lab down` and tests; the agent never calls it.
func Unpin(pinDir string) error {
	entries, err := os.ReadDir(pinDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read pin dir: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if err := os.Remove(filepath.Join(pinDir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(pinDir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
