package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/dpu"
	lkmetrics "github.com/lanekit/lanekit/pkg/metrics"
	"github.com/lanekit/lanekit/pkg/vf"
)

// Where the datapath runs (--mode): here (local, the default), on this
// node's DPU (host: this agent only answers the CNI plugin and moves VFs
// into pods) or here for a host (dpu: this agent runs on the DPU).
const (
	modeLocal = "local"
	modeHost  = "host"
	modeDPU   = "dpu"
)

type modeFlags struct {
	mode       string
	tls        dpu.TLSFiles
	dpuAddr    string // host: the DPU agent's link
	serverName string // host: the name in the DPU's certificate
	hostID     string // host: this host's name in Hello
	listen     string // dpu: where the link is served
	dpuName    string // dpu: this DPU's name in Hello and Status
	vfKind     string // dpu: veth (lab) or sriov
	vfNetns    string // dpu, veth: the host's namespace
	vfPF       string // dpu, sriov: the PF on the DPU; host: the PF whose VFs move
	ipsec      string // dpu: --ipsec-offload
	vmNetns    string // dpu: where the VMs' device namespaces are mounted
	hostPF     string // dpu: the host-facing PF representor (the host's ClusterIP traffic)
	hostIdent  string // dpu: the identity the host's certificate must carry
}

func (m *modeFlags) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&m.mode, "mode", modeLocal, "where the datapath runs: local (this node), host (on this node's DPU: serve the CNI plugin, move VFs into pods) or dpu (this agent runs on a DPU for its host)")
	fs.StringVar(&m.tls.Cert, "tls-cert", "", "host/dpu mode: this side's certificate (PEM) for the host-DPU link (mutual TLS)")
	fs.StringVar(&m.tls.Key, "tls-key", "", "host/dpu mode: the certificate's key (PEM)")
	fs.StringVar(&m.tls.CA, "tls-ca", "", "host/dpu mode: the CA that signed the other side's certificate")
	fs.StringVar(&m.dpuAddr, "dpu-addr", "", "host mode: HOST:PORT of the DPU agent's link")
	fs.StringVar(&m.serverName, "dpu-server-name", "", "host mode: the name the DPU's certificate carries (default: the host part of --dpu-addr)")
	fs.StringVar(&m.hostID, "host-id", "", "host mode: this host's name as the DPU agent reports it (default: the hostname)")
	fs.StringVar(&m.listen, "dpu-listen", "", "dpu mode: ADDR:PORT the host agent connects to")
	fs.StringVar(&m.dpuName, "dpu-name", "", "dpu mode: this DPU's name as the host agent reports it (default: --node-name, else the hostname)")
	fs.StringVar(&m.vfKind, "vf-kind", vf.KindSRIOV, "dpu mode: what a VF is: sriov (a VF of --vf-pf and its switchdev representor) or veth (a veth pair into --vf-host-netns; the lab)")
	fs.StringVar(&m.vfNetns, "vf-host-netns", "", "dpu mode, --vf-kind veth: path of the host's network namespace")
	fs.StringVar(&m.vfPF, "vf-pf", "", "dpu mode, sriov: the PF (switchdev) whose VFs pods get; host mode, sriov: the host's PF netdev whose virtfn<N> the DPU hands out")
	fs.StringVar(&m.vmNetns, "vm-netns-dir", "/run/lanekit/dpu-vm", "dpu mode: directory where each VM's device namespace on the DPU is mounted, as <dpu-name>-<vm> (empty: VMs refused)")
	fs.StringVar(&m.hostPF, "dpu-host-pf", "", "dpu mode: the host-facing PF representor: the host's own traffic to ClusterIPs (its processes, hostNetwork pods) is load-balanced there (empty: not)")
	fs.StringVar(&m.hostIdent, "dpu-host-identity", "", "dpu mode: the one host this DPU serves: every call on the link must present a certificate naming it (a DNS or URI SAN, or the CN); others from the same CA are refused (default: --node-name, the host's Node)")
	fs.StringVar(&m.ipsec, "ipsec-offload", dpu.IPsecOffloadOff, "dpu mode: node-to-node IPsec on the DPU (on is refused: probed, not implemented)")
}

func (m *modeFlags) validate() error {
	if m.hostPF != "" && m.mode != modeDPU {
		return errors.New("--dpu-host-pf needs --mode dpu")
	}
	if m.hostIdent != "" && m.mode != modeDPU {
		return errors.New("--dpu-host-identity needs --mode dpu")
	}
	switch m.mode {
	case modeLocal:
		return nil
	case modeHost:
		if m.dpuAddr == "" {
			return errors.New("--mode host needs --dpu-addr")
		}
	case modeDPU:
		if m.listen == "" {
			return errors.New("--mode dpu needs --dpu-listen")
		}
		switch m.vfKind {
		case vf.KindVeth:
			if m.vfNetns == "" {
				return errors.New("--vf-kind veth needs --vf-host-netns")
			}
		case vf.KindSRIOV:
			if m.vfPF == "" {
				return errors.New("--vf-kind sriov needs --vf-pf")
			}
		default:
			return fmt.Errorf("--vf-kind %q: want sriov or veth", m.vfKind)
		}
	default:
		return fmt.Errorf("--mode %q: want local, host or dpu", m.mode)
	}
	if m.tls.Cert == "" || m.tls.Key == "" || m.tls.CA == "" {
		return fmt.Errorf("--mode %s needs --tls-cert, --tls-key and --tls-ca (the link is mutual TLS)", m.mode)
	}
	return nil
}

// runHost is lanekitd --mode host: the agent API for the CNI plugin on
// socket, endpoints on the DPU; the link's metrics on metricsAddr ("": off).
func runHost(m modeFlags, socket, metricsAddr string, log *slog.Logger) error {
	name := m.serverName
	if name == "" {
		host, _, err := net.SplitHostPort(m.dpuAddr)
		if err != nil {
			return fmt.Errorf("--dpu-addr: %w", err)
		}
		name = host
	}
	creds, err := dpu.LoadCreds(m.tls, log)
	if err != nil {
		return err
	}
	id := m.hostID
	if id == "" {
		id, _ = os.Hostname()
	}
	h, err := dpu.NewHost(dpu.HostConfig{Socket: socket, DPUAddr: m.dpuAddr, Creds: creds, ServerName: name, Name: id,
		Version: agent.Version, VFPF: m.vfPF, Log: log})
	if err != nil {
		return err
	}
	defer h.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if metricsAddr != "" {
		mt := lkmetrics.New(lkmetrics.Options{Log: log})
		if err := mt.WatchDPULink(h); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		bound, err := mt.Serve(ctx, metricsAddr)
		if err != nil {
			return err
		}
		log.Info("serving metrics", "addr", bound.String(), "path", "/metrics")
	}
	go warnExpiry(ctx, h, log)
	return h.Run(ctx)
}

// dpuSide is the DPU mode's link server, set up before the agent starts.
type dpuSide struct {
	srv *dpu.Server
	lis net.Listener
	m   modeFlags
}

// setupDPU configures the agent for DPU mode: representor pod devices,
// veth device mode, the location in Status; it listens on the link's
// address (refused early when taken) and checks --ipsec-offload.
func (m modeFlags) setupDPU(cfg *agent.Config, log *slog.Logger) (*dpuSide, error) {
	if m.mode != modeDPU {
		return nil, nil
	}
	if err := dpu.CheckIPsecOffload(m.ipsec, agent.ProbeEncryption().IPsec); err != nil {
		return nil, err
	}
	var reps vf.Representors
	switch m.vfKind {
	case vf.KindVeth:
		reps = vf.Veth{HostNetns: m.vfNetns}
	default:
		reps = vf.SRIOV{PF: m.vfPF}
	}
	if cfg.DeviceMode != agent.DeviceAuto && cfg.DeviceMode != "veth" {
		return nil, fmt.Errorf("--mode dpu: representors are veth-like devices, not --device-mode %s", cfg.DeviceMode)
	}
	cfg.DeviceMode = "veth"
	cfg.HostPF = m.hostPF
	node, _ := os.Hostname()
	if cfg.NodeName != "" {
		node = cfg.NodeName
	}
	if m.dpuName != "" {
		node = m.dpuName
	}
	hostIdent := m.hostIdent
	if hostIdent == "" {
		hostIdent = cfg.NodeName // the host's Node (validateKube: one of them is set)
	}
	creds, err := dpu.LoadCreds(m.tls, log)
	if err != nil {
		return nil, err
	}
	// With the Kubernetes source the API server owns Services and policy:
	// the host may not write them (auth.go).
	s := &dpu.Server{Reps: reps, Node: node, Version: agent.Version, Log: log, Creds: creds, HostIdentity: hostIdent,
		HostObjects: cfg.NodeName == ""}
	cfg.ServerOptions = append(cfg.ServerOptions, grpc.ChainUnaryInterceptor(s.StatusInterceptor))
	if m.vmNetns != "" {
		s.VMNetns = dpu.VMNetns{Dir: m.vmNetns, Prefix: node + "-"}
	}
	cfg.PodDevices = dpu.Representors{Reps: reps}
	cfg.DatapathLocation = dpuLocation(s.Location, cfg.NodeName)
	lis, err := net.Listen("tcp", m.listen)
	if err != nil {
		return nil, fmt.Errorf("--dpu-listen: %w", err)
	}
	return &dpuSide{srv: s, lis: lis, m: m}, nil
}

// serve runs the link for agent a until ctx is done; the link's metrics go
// to mt (nil: off).
func (d *dpuSide) serve(ctx context.Context, a *agent.Agent, mt *lkmetrics.Metrics, log *slog.Logger, failed func()) error {
	if mt != nil {
		if err := mt.WatchDPULink(d.srv); err != nil {
			d.lis.Close()
			return fmt.Errorf("metrics: %w", err)
		}
	}
	d.srv.API = agent.NewAPIServer(a)
	go warnExpiry(ctx, d.srv, log)
	go func() {
		if err := d.srv.ServeListener(ctx, d.lis); err != nil {
			log.Error("DPU link stopped", "err", err)
			failed()
		}
	}()
	return nil
}

// warnExpiry logs, at start and daily, each link certificate that expires
// within dpu.ExpiryWarning (the metric and `lanekit status` show it too).
func warnExpiry(ctx context.Context, src lkmetrics.DPULinkSource, log *slog.Logger) {
	t := time.NewTicker(24 * time.Hour)
	defer t.Stop()
	for {
		st := src.LinkStatus()
		for _, c := range st.GetCertificates() {
			if left := time.Until(time.Unix(c.GetNotAfterUnix(), 0)); left < dpu.ExpiryWarning {
				log.Warn("a DPU link certificate expires soon: rotate it before the link breaks", "role", st.GetRole(),
					"cert", c.GetWhich(), "subject", c.GetSubject(), "not_after", time.Unix(c.GetNotAfterUnix(), 0).UTC().Format(time.RFC3339),
					"days_left", int(left.Hours()/24))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// validateKube checks --mode with the Kubernetes flags: a DPU agent with
// --node-name watches for its host (the Node is the host's), and the
// Node's InternalIP is the host's address, not on the DPU: its uplink must
// be named. The host agent runs no watchers.
func (m modeFlags) validateKube(kube kubeFlags, uplink string) error {
	switch {
	case m.mode == modeHost && kube.nodeName != "":
		return errors.New("--mode host runs no Kubernetes watchers: give --node-name (the host's Node) to the DPU agent")
	case m.mode == modeDPU && kube.nodeName != "" && uplink == "":
		return errors.New("--mode dpu with --node-name needs --uplink: the Node's InternalIP is the host's, not on the DPU")
	case m.mode == modeDPU && m.hostIdent == "" && kube.nodeName == "":
		return errors.New("--mode dpu needs --dpu-host-identity (or --node-name, the host's Node): the one host whose certificate may drive this DPU")
	}
	return nil
}

// dpuLocation is the DPU agent's Status location: the link's, and with the
// Kubernetes source the host's Node it serves (its pod CIDR, routes,
// Services, policy, and the Pods bound to it by spec.nodeName).
func dpuLocation(link func() string, node string) func() string {
	if node == "" {
		return link
	}
	return func() string { return link() + "; Kubernetes node " + node }
}
