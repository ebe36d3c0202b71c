// Package agent is lanekitd: it owns the node's pod CIDR, the pod devices and
// the datapath's endpoint entries, persists them in the store and serves the
// gRPC API (api/v1) on a unix socket.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/ipam"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/netdev"
	"github.com/lanekit/lanekit/pkg/service"
	"github.com/lanekit/lanekit/pkg/store"
	"github.com/lanekit/lanekit/pkg/xsk"
)

// Version is reported by Status; set at link time for releases.
var Version = "0.1.0-dev"

// Device-mode choices for Config.DeviceMode.
const (
	DeviceAuto = "auto" // netkit when the kernel has it, veth otherwise
)

// Config is how lanekitd is started.
type Config struct {
	StateDir string
	Socket   string
	Uplink   string
	PodCIDR  netip.Prefix
	PodCIDR6 netip.Prefix // the node's IPv6 pod CIDR; invalid: IPv4 only (ipv6.go)
	// NodeName and Zone (the Node's topology.kubernetes.io/zone label) are
	// what EndpointSlice topology hints are matched against; empty: none.
	NodeName, Zone string
	BPFDir         string // pin directory; on a BPF filesystem (mounted if missing under /sys/fs/bpf)
	DeviceMode     string // DeviceAuto, "veth", "netkit" (L3) or "netkit-l2"
	MTU            int    // 0: the uplink's MTU
	// ClusterDNS and ClusterDomain are what VM endpoints' DHCP offers as
	// name servers and search domains (kubelet's clusterDNS and
	// clusterDomain, as a ClusterFirst pod's resolv.conf has them); no
	// ClusterDNS: no name servers and no search list.
	ClusterDNS    []netip.Addr
	ClusterDomain string
	// SNATPortMin..SNATPortMax: the NodePort/hairpin SNAT source ports
	// (datapath.Config; 0, 0: the default 61000-65535).
	SNATPortMin, SNATPortMax uint16
	// LBFrontends and LBBackends size the service maps (0: the datapath's
	// defaults); Services that do not fit wait, reported, until room
	// returns (capacity.go).
	LBFrontends, LBBackends int
	// PolicyMaps sizes the policy and tunnel maps (0 fields: the
	// datapath's defaults); their fill is reported beside the service maps.
	PolicyMaps datapath.PolicySizes
	// HostNetns is the node's namespace when it is not the agent's own
	// (tests and the lab); empty means the current one.
	HostNetns string
	// VMSocketDir holds one fd-passing socket per VM (<name>.sock); empty
	// means DefaultVMSocketDir.
	VMSocketDir string
	// OpenDatapath overrides how the datapath is opened: tests inject an
	// in-memory one (internal/agenttest) or fakes. Nil: the BPF datapath.
	OpenDatapath func(datapath.Config, *slog.Logger) (datapath.Datapath, error)
	// RestoreObject, when set, is given each object read back from the
	// store at start before the agent keeps it: the Kubernetes source's
	// interning (k8s.InternObject), so that the restored objects, held
	// beside the informers' caches until each kind's full set replaces
	// them, share their strings and label sets. It may not change what the
	// object says.
	RestoreObject func(*k8sobj.Object)
	// ServerOptions are added to the API's gRPC server (the metrics
	// interceptor that times each call).
	ServerOptions []grpc.ServerOption
	// ExtraServices registers more services on the API's gRPC server (the
	// flow event Observer, pkg/observe).
	ExtraServices func(*grpc.Server)
	// NodeAddrs are the addresses NodePort services listen on; empty means
	// the uplink's IPv4 addresses.
	NodeAddrs []netip.Addr
	// ExternalIPs says which Services' spec.externalIPs are served (the
	// zero value: all; CVE-2020-8554).
	ExternalIPs service.ExternalIPPolicy
	// PodCongestionControl, when set, is the TCP congestion control of every
	// new pod's namespace (e.g. bbr, recommended with egress bandwidth
	// limits); checked against the kernel's at start.
	PodCongestionControl string
	// MaintenanceInterval is how often Run collects expired conntrack
	// entries and retries failed datapath updates; 0 means
	// DefaultMaintenanceInterval.
	MaintenanceInterval time.Duration
	// TxGSO says who segments a VM guest's TSO/USO frames: TxGSOKernel (or
	// empty) hands each backend that asks a GSO socket per queue (xsk.OpenGSO)
	// so the frames leave whole as one GSO packet; TxGSOSoftware hands none
	// and the backend cuts them into AF_XDP frames.
	TxGSO string
	// RxGSO says how frames for a VM reach its backend: RxGSOKernel hands
	// each backend that asks a wire -> guest AF_PACKET socket per queue
	// (xsk.OpenRxGSO) and takes the XDP program off the VM's device, so a
	// 64 KiB GSO packet arrives whole; RxGSOXDP (or empty, or a backend that
	// does not ask) keeps steer_vm and the AF_XDP sockets.
	RxGSO string
	// VhostBin is the lanekit-vhost binary the agent runs for CNI VM
	// attachments; empty: next to the agent's binary, else on PATH.
	VhostBin string
	// VhostUID/GID, when set, is the one user every backend runs as (shared:
	// no isolation between backends; tests). nil: each VM's backend gets its
	// own uid and gid from VhostUIDRange.
	VhostUID, VhostGID *uint32
	// VhostUIDRange is where per-VM backend uids come from; nil:
	// DefaultVhostUIDRange.
	VhostUIDRange *UIDRange
	// KubeletUserns is the host uid range kubelet gives user-namespaced
	// pods (vhostuid.go): backend uids must be outside it. nil:
	// KubeletUsernsRange, kubelet's default; the zero range: none.
	KubeletUserns *UIDRange
	// VhostFrontendUID is granted access (an ACL) to each backend's
	// vhost-user socket; nil: DefaultVhostFrontendUID (KubeVirt's qemu).
	VhostFrontendUID *uint32
	// KubeletRootDir is kubelet's --root-dir: VM attachments find the
	// launcher pod's socket volume under it. Empty: DefaultKubeletRootDir.
	KubeletRootDir string
	// VMHostSocketRoots are the directories a VM attachment's hostSocketDir
	// (from the CNI config, i.e. a NetworkAttachmentDefinition) must be
	// beneath, with no symbolic link below them. Empty:
	// <KubeletRootDir>/pods and DefaultVMHostSocketRoot.
	VMHostSocketRoots []string
	// SockLBCgroup is the cgroup2 directory the socket load balancer
	// attaches to (services for the node's processes and hostNetwork pods);
	// cgroup2 is mounted there if it is not on one. A node uses its
	// cgroup2 root; the lab a child cgroup per node. Empty: off.
	SockLBCgroup string
	// ServiceHealthChecks: serve the healthCheckNodePort of LoadBalancer
	// Services with externalTrafficPolicy Local (healthcheck.go).
	ServiceHealthChecks bool
	// RoutingMode is RoutingNative ("" too) or RoutingTunnel (tunnel.go);
	// TunnelPort the VXLAN UDP port (0: DefaultTunnelPort); TunnelNodes the
	// other nodes' pod CIDRs and underlay addresses when no API server says.
	RoutingMode string
	// BIGTCP gives pod devices and the uplink GSO/GRO sizes above 64 KiB
	// where the uplink's driver and the kernel support it (bigtcp.go).
	BIGTCP bool
	// BandwidthManager enforces pods' kubernetes.io/egress-bandwidth
	// (bandwidth.go, lanekitd --bandwidth-manager).
	BandwidthManager bool
	TunnelPort       int
	TunnelNodes      []datapath.TunnelNode
	// Encryption: EncryptionNone ("" too); anything else is refused.
	Encryption string
	// PodDevices creates pod endpoints' devices; nil: pairs in the pod's
	// namespace (poddevices.go). The DPU agent's are VF representors.
	PodDevices PodDevices
	// DatapathLocation says in Status where the datapath runs for whom;
	// nil: "local".
	DatapathLocation func() string
	// HostPF: the DPU agent's host-facing PF representor, where the host's
	// own ClusterIP traffic is load-balanced (datapath.Config.HostPF).
	HostPF string
}

// Agent is one node's agent.
type Agent struct {
	cfg   Config
	log   *slog.Logger
	st    *store.Store
	ipam  *ipam.IPAM
	ipam6 *ipam.IPAM // nil without Config.PodCIDR6
	host  *netdev.Host
	devs  PodDevices // pod endpoints' devices (poddevices.go)
	// bigTCP is what setupBIGTCP decided (bigtcp.go).
	bigTCP BIGTCPInfo
	// bandwidth is how egress limits are enforced, and why
	// (setupBandwidth, bandwidth.go).
	bandwidth, bandwidthWhy string
	dp                      datapath.Datapath
	// backend names the datapath in Status: "bpf", or "test" for an
	// injected one.
	backend string

	mode       datapath.DeviceMode
	modeReason string
	features   netdev.Features
	mtu        int

	mu  sync.Mutex             // serialises changes to endpoints
	vms map[string]*xsk.Server // running socket servers by VM name, under mu
	// restore is the control plane's background restore (nil: restored
	// before New returned, as tests do).
	restore *restoreState
	// lastStats are ControlStats' last counts (restore.go: statsWait).
	lastStats atomic.Pointer[ControlStats]
	// backends are the vhost-user backends the agent runs (CNI VM
	// attachments), by VM name, under mu.
	backends map[string]*backendProc
	// epRoutes are the /32 routes to other nodes' claims of moved VM
	// addresses that this agent installed (vmmigrate.go), under mu.
	epRoutes map[netip.Addr]EndpointRoute
	// sourceWatches are the running hand-over watches by VM name
	// (vmhandover.go), under mu.
	sourceWatches map[string]sourceWatch

	resolverMu sync.Mutex
	resolver   VMIResolver // how VM attachments find their VMI (SetVMIResolver)

	readyMu     sync.Mutex
	readyChecks []readyCheck // more readiness conditions (AddReadyCheck)

	// ctl is the service and policy control plane (objects.go); its own
	// lock nests inside mu.
	ctl *ctlPlane
	// health serves healthCheckNodePorts (nil: off); its lock nests in
	// ctl's.
	health *healthChecks
	// sockLB is the socket load balancer's state (socklb.go).
	sockLB SockLBState

	// The node's addresses last written to the policy ipcache
	// (hostaddrs.go), under hostAddrMu.
	hostAddrMu      sync.Mutex
	hostAddrs       []netip.Addr
	hostAddrsSynced bool

	// Routing (tunnel.go): the VXLAN device in tunnel mode, the probed
	// encryption facilities, the peers from the API server (under tunnelMu).
	tunnelDev   string
	encryption  EncryptionFeatures
	tunnelMu    sync.Mutex
	tunnelPeers []datapath.TunnelNode
	// tunnelClaims: moved VM address -> the owner's underlay (epclaims.go);
	// nil until loaded from the node map.
	tunnelClaims map[netip.Addr]netip.Addr
}

func openDatapath(cfg Config, tunnel string, log *slog.Logger) (datapath.Datapath, string, error) {
	dcfg := datapath.Config{PinDir: cfg.BPFDir, Uplink: cfg.Uplink, SNATPortMin: cfg.SNATPortMin, SNATPortMax: cfg.SNATPortMax,
		Tunnel: tunnel, HostPF: cfg.HostPF, LBFrontends: cfg.LBFrontends, LBBackends: cfg.LBBackends, PolicyMaps: cfg.PolicyMaps}
	if cfg.OpenDatapath != nil {
		dp, err := cfg.OpenDatapath(dcfg, log)
		return dp, "test", err
	}
	if cfg.BPFDir == "" {
		return nil, "", errors.New("bpf dir is required")
	}
	if err := ensureBPFFS(cfg.BPFDir, log); err != nil {
		return nil, "", err
	}
	l, err := datapath.Open(dcfg, log)
	if err != nil {
		return nil, "", err
	}
	return l, "bpf", nil
}

// New starts an agent: enables forwarding, probes the kernel, opens the
// store and the datapath, and re-adopts stored endpoints.
func New(cfg Config, log *slog.Logger) (_ *Agent, err error) {
	if cfg.StateDir == "" {
		return nil, errors.New("new agent: state dir is required")
	}
	if err := checkPodCIDRs(cfg); err != nil { // ipv6.go
		return nil, fmt.Errorf("new agent: %w", err)
	}
	if err := checkVhostUIDs(cfg); err != nil { // vhostuid.go
		return nil, fmt.Errorf("new agent: %w", err)
	}
	if err := checkClusterDNS(cfg); err != nil { // vmdhcp.go
		return nil, fmt.Errorf("new agent: %w", err)
	}
	if cfg.DeviceMode == "" {
		cfg.DeviceMode = DeviceAuto
	}
	if cfg.VMSocketDir == "" {
		cfg.VMSocketDir = DefaultVMSocketDir
	}
	a := &Agent{cfg: cfg, log: log, vms: map[string]*xsk.Server{}, backends: map[string]*backendProc{}}
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	if a.host, err = netdev.NewHost(cfg.HostNetns); err != nil {
		return nil, fmt.Errorf("new agent: %w", err)
	}
	if a.devs = cfg.PodDevices; a.devs == nil {
		a.devs = localDevices{a.host}
	}
	if err := a.host.EnableForwarding(); err != nil {
		return nil, fmt.Errorf("new agent: %w", err)
	}
	if g := cfg.TxGSO; g != "" && g != TxGSOKernel && g != TxGSOSoftware {
		return nil, fmt.Errorf("new agent: --tx-gso %q: want %s or %s", g, TxGSOKernel, TxGSOSoftware)
	}
	if g := cfg.RxGSO; g != "" && g != RxGSOKernel && g != RxGSOXDP {
		return nil, fmt.Errorf("new agent: --rx-gso %q: want %s or %s", g, RxGSOKernel, RxGSOXDP)
	}
	if cc := cfg.PodCongestionControl; cc != "" {
		if err := a.host.CheckCongestionControl(cc); err != nil {
			return nil, fmt.Errorf("new agent: --pod-congestion-control: %w", err)
		}
	}
	a.mtu = cfg.MTU
	if a.mtu == 0 {
		if cfg.Uplink == "" {
			return nil, errors.New("new agent: need --uplink or --mtu to choose the pod MTU")
		}
		if a.mtu, err = a.host.LinkMTU(cfg.Uplink); err != nil {
			return nil, fmt.Errorf("new agent: uplink mtu: %w", err)
		}
	}
	if err := a.setupRouting(); err != nil { // tunnel mode: pod MTU, VXLAN device
		return nil, fmt.Errorf("new agent: %w", err)
	}
	if err := a.setupBIGTCP(); err != nil {
		return nil, fmt.Errorf("new agent: %w", err)
	}
	cfg = a.cfg
	a.features = a.host.ProbeFeatures(cfg.BPFDir)
	if err := a.chooseMode(); err != nil {
		return nil, fmt.Errorf("new agent: %w", err)
	}
	log.Info("kernel probed", "release", a.features.Release, "tcx", a.features.TCX.Supported,
		"netkit", a.features.Netkit.Supported, "bpffs", a.features.BPFFS.Supported, "btf", a.features.BTF.Supported,
		"device_mode", a.mode, "reason", a.modeReason)

	if a.st, err = store.Open(cfg.StateDir); err != nil {
		return nil, fmt.Errorf("new agent: %w", err)
	}
	if err := a.openIPv4(); err != nil { // ipv6.go
		return nil, fmt.Errorf("new agent: %w", err)
	}
	if err := a.openIPv6(); err != nil {
		return nil, fmt.Errorf("new agent: %w", err)
	}
	err = a.host.Do(func() error {
		var err error
		a.dp, a.backend, err = openDatapath(cfg, a.tunnelDev, log)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("new agent: open datapath: %w", err)
	}
	a.setupBandwidth()
	if err := a.syncTunnelNodes(); err != nil {
		return nil, fmt.Errorf("new agent: %w", err)
	}
	if err := a.adopt(); err != nil {
		return nil, fmt.Errorf("new agent: %w", err)
	}
	if eps, err := a.endpoints(); err != nil {
		return nil, fmt.Errorf("new agent: %w", err)
	} else if err := a.syncIncomingDrops(eps); err != nil { // vmincoming.go
		a.log.Warn("drop rules of incoming VM endpoints", "err", err)
	}
	if err := a.setupSockLB(); err != nil {
		return nil, fmt.Errorf("new agent: %w", err)
	}
	// The stored Services and policies, in the background (restore.go):
	// at scale they take seconds, and the socket serves meanwhile.
	a.startRestore()
	return a, nil
}

func (a *Agent) chooseMode() error {
	switch a.cfg.DeviceMode {
	case DeviceAuto:
		if a.features.Netkit.Supported {
			a.mode, a.modeReason = datapath.ModeNetkit, a.features.Netkit.Detail
		} else {
			a.mode, a.modeReason = datapath.ModeVeth, "veth fallback: "+a.features.Netkit.Detail
		}
	case string(datapath.ModeVeth):
		a.mode, a.modeReason = datapath.ModeVeth, "veth requested by --device-mode"
	case string(datapath.ModeNetkit), string(datapath.ModeNetkitL2):
		if !a.features.Netkit.Supported {
			return fmt.Errorf("--device-mode %s: %s", a.cfg.DeviceMode, a.features.Netkit.Detail)
		}
		a.mode, a.modeReason = datapath.DeviceMode(a.cfg.DeviceMode), a.cfg.DeviceMode+" requested by --device-mode"
	default:
		return fmt.Errorf("unknown device mode %q (want auto, veth, netkit or netkit-l2)", a.cfg.DeviceMode)
	}
	return nil
}

// Close releases the agent's handles. Devices, stored state and pinned
// datapath objects stay: pods keep forwarding while the agent is down.
func (a *Agent) Close() error {
	var errs []error
	if err := a.waitRestore(); err != nil { // it uses the store and the datapath
		errs = append(errs, err)
	}
	a.mu.Lock()
	for name := range a.vms {
		errs = append(errs, a.stopVMServer(name))
	}
	for name := range a.sourceWatches {
		a.stopSourceWatchLocked(name, "")
	}
	a.detachBackends()
	a.mu.Unlock()
	if a.health != nil {
		a.health.close()
	}
	if a.dp != nil {
		errs = append(errs, a.dp.Close())
	}
	if a.st != nil {
		errs = append(errs, a.st.Close())
	}
	if a.host != nil {
		errs = append(errs, a.host.Close())
	}
	return errors.Join(errs...)
}

// endpoints returns every stored endpoint, by ID.
func (a *Agent) endpoints() ([]endpoint.Endpoint, error) {
	var out []endpoint.Endpoint
	err := a.st.View(func(tx *store.Tx) error {
		return tx.ForEach(store.Endpoints, func(k []byte, raw json.RawMessage) error {
			var ep endpoint.Endpoint
			if err := json.Unmarshal(raw, &ep); err != nil {
				return fmt.Errorf("decode endpoint %q: %w", k, err)
			}
			out = append(out, ep)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list endpoints: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// adopt reconciles stored state with the node after a (re)start: pending
// records (an ADD the previous agent did not finish) are rolled back;
// endpoints whose host device exists are re-programmed (the datapath updates
// pinned attachments in place), the others are dropped with their addresses;
// addresses and IDs that belong to no endpoint are freed; finally map
// entries, counters, socket slots and pinned links that no record owns are
// swept from the datapath.
func (a *Agent) adopt() error {
	eps, err := a.endpoints()
	if err != nil {
		return fmt.Errorf("adopt: %w", err)
	}
	kept, dropped, rolledBack := 0, 0, 0
	for _, ep := range eps {
		if ep.Pending {
			if err := a.rollback(&ep); err != nil {
				return fmt.Errorf("adopt: %w", err)
			}
			rolledBack++
			continue
		}
		hl, ok, err := a.host.LookupHost(ep.HostIfName)
		if err != nil {
			return fmt.Errorf("adopt endpoint %d: %w", ep.ID, err)
		}
		if !ok {
			a.log.Info("dropping endpoint whose device is gone", "id", ep.ID, "container", ep.ContainerID, "dev", ep.HostIfName)
			if dpEp, err := a.dpEndpoint(&ep); err == nil {
				if err := a.host.Do(func() error { return a.dp.DeleteEndpoint(dpEp) }); err != nil {
					a.log.Warn("delete datapath entry of dropped endpoint", "id", ep.ID, "err", err)
				}
			}
			if ep.Kind == endpoint.KindVM {
				a.detachVM(&ep)
				a.stopVMBackend(&ep)
			}
			if err := a.forget(ep.StoreKey(), ep.ID); err != nil {
				return fmt.Errorf("adopt: %w", err)
			}
			dropped++
			continue
		}
		if hl.Index != ep.HostIfIndex || hl.MAC.String() != ep.HostMAC && len(hl.MAC) > 0 {
			ep.HostIfIndex = hl.Index
			if len(hl.MAC) > 0 {
				ep.HostMAC = hl.MAC.String()
			}
			if err := a.st.Update(func(tx *store.Tx) error { return tx.Put(store.Endpoints, []byte(ep.StoreKey()), ep) }); err != nil {
				return fmt.Errorf("adopt endpoint %d: %w", ep.ID, err)
			}
		}
		dpEp, err := a.dpEndpoint(&ep)
		if err == nil && claimsAddress(&ep) { // not an incoming or moved VM (vmmigrate.go)
			err = a.host.Do(func() error { return a.dp.UpsertEndpoint(dpEp) })
		}
		if err != nil {
			// Keep the record: DEL or GC will clean it; the device still exists.
			a.log.Error("re-adopt endpoint in datapath", "id", ep.ID, "dev", ep.HostIfName, "err", err)
			continue
		}
		if ep.Kind == endpoint.KindVM {
			if err := a.adoptVM(&ep); err != nil {
				// Keep the record: pods keep forwarding to it, DelVM cleans it.
				a.log.Error("re-adopt vm", "id", ep.ID, "vm", ep.VM.Name, "err", err)
			} else if ep.VM.Backend != nil {
				if err := a.runBackend(&ep); err != nil {
					// Keep the record: a repeated ADD retries, DEL cleans it.
					a.log.Error("re-adopt vm backend", "vm", ep.VM.Name, "err", err)
				}
			}
		}
		kept++
	}
	freed, err := a.freeOrphans(nil)
	if err != nil {
		return fmt.Errorf("adopt: %w", err)
	}
	swept, err := a.sweep()
	if err != nil {
		return fmt.Errorf("adopt: %w", err)
	}
	a.log.Info("re-adopted endpoints", "kept", kept, "dropped", dropped, "rolled_back", rolledBack,
		"orphans_freed", freed, "datapath_swept", swept.Total())
	return nil
}

// rollback undoes an ADD that a previous agent did not finish: its devices,
// socket file and records go; sweep removes its datapath state.
func (a *Agent) rollback(ep *endpoint.Endpoint) error {
	a.log.Info("rolling back unfinished add", "id", ep.ID, "attachment", ep.Key(), "dev", ep.HostIfName)
	if err := a.devs.DeletePod(ep.HostIfName); err != nil {
		return fmt.Errorf("roll back %s: %w", ep.Key(), err)
	}
	if ep.VM != nil && ep.VM.Socket != "" {
		if err := os.Remove(ep.VM.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("roll back %s: remove socket: %w", ep.Key(), err)
		}
	}
	if err := a.forget(ep.StoreKey(), ep.ID); err != nil {
		return fmt.Errorf("roll back %s: %w", ep.Key(), err)
	}
	return nil
}

// sweeper is a datapath that can drop what no record owns.
type sweeper interface {
	Sweep(datapath.Owned) (datapath.Swept, error)
}

// sweep removes datapath state that no committed record owns.
func (a *Agent) sweep() (datapath.Swept, error) {
	sw, ok := a.dp.(sweeper)
	if !ok {
		return datapath.Swept{}, nil
	}
	eps, err := a.endpoints()
	if err != nil {
		return datapath.Swept{}, fmt.Errorf("sweep: %w", err)
	}
	own := datapath.Owned{IDs: map[uint32]bool{}, PodLinks: map[string]bool{}, VMs: map[uint32]bool{}, XSKSlots: map[uint32]bool{}}
	for _, ep := range eps {
		if ep.Pending {
			continue
		}
		own.IDs[ep.ID] = true
		own.PodLinks[ep.HostIfName] = true
		if ep.Kind == endpoint.KindVM && ep.VM != nil {
			own.VMs[ep.ID] = true
			for q := 0; q < ep.VM.Queues; q++ {
				own.XSKSlots[ep.VM.XSKBase+uint32(q)] = true
			}
		}
	}
	var got datapath.Swept
	err = a.host.Do(func() error {
		var err error
		got, err = sw.Sweep(own)
		return err
	})
	if err != nil {
		return got, fmt.Errorf("sweep: %w", err)
	}
	if got.Total() > 0 {
		a.log.Warn("swept datapath state no record owns", "endpoints", got.Endpoints, "by_ifindex", got.ByIfindex,
			"counters", got.Metrics, "pod_links", got.PodLinks, "vm_links", got.VMLinks)
	}
	return got, nil
}

// freeOrphans releases addresses and IDs whose owner has no endpoint record
// and is not in keep.
func (a *Agent) freeOrphans(keep map[string]bool) (int, error) {
	n := 0
	err := a.st.Update(func(tx *store.Tx) error {
		owners := map[string]bool{}
		err := tx.ForEach(store.IPAM, func(k []byte, raw json.RawMessage) error {
			var al ipam.Allocation
			if err := json.Unmarshal(raw, &al); err != nil {
				return fmt.Errorf("decode allocation %x: %w", k, err)
			}
			owners[al.Owner] = true
			return nil
		})
		if err != nil {
			return err
		}
		var idKeys [][]byte
		err = tx.ForEach(store.EndpointIDs, func(k []byte, raw json.RawMessage) error {
			var owner string
			if err := json.Unmarshal(raw, &owner); err != nil {
				return fmt.Errorf("decode endpoint id %x: %w", k, err)
			}
			if has, err := tx.Has(store.Endpoints, []byte(owner)); err != nil || has || keep[owner] {
				return err
			}
			idKeys = append(idKeys, append([]byte(nil), k...))
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range idKeys {
			if err := tx.Delete(store.EndpointIDs, k); err != nil {
				return err
			}
		}
		_, err = releaseSlotsTx(tx, func(owner string) (bool, error) {
			has, err := tx.Has(store.Endpoints, []byte(owner))
			return !has && !keep[owner], err
		})
		if err != nil {
			return err
		}
		for owner := range owners {
			has, err := tx.Has(store.Endpoints, []byte(owner))
			if err != nil {
				return err
			}
			if has || keep[owner] || isMovedOwner(owner) { // moved: held for a claim elsewhere (vmmigrate.go)
				continue
			}
			a.log.Info("releasing orphaned address", "owner", owner)
			if err := a.releaseAddrsTx(tx, owner); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("free orphans: %w", err)
	}
	return n, nil
}

// forget deletes an endpoint's record, ID, address and socket slots in one
// transaction.
func (a *Agent) forget(key string, id uint32) error {
	err := a.st.Update(func(tx *store.Tx) error {
		if err := a.releaseAddrsTx(tx, key); err != nil {
			return err
		}
		if _, err := releaseSlotsTx(tx, func(owner string) (bool, error) { return owner == key, nil }); err != nil {
			return err
		}
		if id != 0 {
			if err := tx.Delete(store.EndpointIDs, endpoint.IDKey(id)); err != nil {
				return err
			}
		}
		return tx.Delete(store.Endpoints, []byte(key))
	})
	if err != nil {
		return fmt.Errorf("forget %s: %w", key, err)
	}
	return nil
}

// Run serves the API on cfg.Socket until ctx is cancelled, then stops
// gracefully. The caller closes the agent afterwards.
func (a *Agent) Run(ctx context.Context) error {
	srv, lis, err := a.listen()
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	every := a.cfg.MaintenanceInterval
	if every <= 0 {
		every = DefaultMaintenanceInterval
	}
	mctx, stop := context.WithCancel(ctx)
	defer stop()
	a.log.Info("serving", "socket", a.cfg.Socket, "pod_cidr", a.cfg.PodCIDR, "datapath", a.backend, "device_mode", a.mode)
	var restored <-chan struct{}
	if a.restore != nil {
		restored = a.restore.done
	} else {
		done := make(chan struct{})
		close(done)
		restored = done
	}
	for {
		select {
		case <-ctx.Done():
			a.log.Info("shutting down")
			stopGracefully(srv)
			<-errc
			return nil
		case err := <-errc:
			return fmt.Errorf("serve %s: %w", a.cfg.Socket, err)
		case <-restored:
			restored = nil
			if err := a.restore.errOrNil(); err != nil {
				stopGracefully(srv)
				<-errc
				return err
			}
			// The periodic work needs the control plane.
			go a.maintain(mctx, every)
			go a.watchHostAddrs(mctx)
		}
	}
}
