package dpu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"

	apiv1 "github.com/lanekit/lanekit/api/v1"
)

// HostConfig is how the host agent is started.
type HostConfig struct {
	Socket  string // the agent API's unix socket (the CNI plugin's agentSocket)
	DPUAddr string // host:port of the DPU agent's link
	// Creds are the host's certificate, key and CA (read again when the
	// files change); the DPU's certificate must name ServerName (a DNS
	// name or an IP address).
	Creds      *Creds
	ServerName string
	Name       string // this host's name in Hello
	Version    string
	// VFPF and Sysfs: the host's PF whose VFs an sriov DPU hands out (the
	// host finds VF n under <sysfs>/class/net/<VFPF>/device/virtfn<n>).
	VFPF, Sysfs string
	// Netns is the host's namespace when it is not the agent's own (tests);
	// empty: the current one.
	Netns string
	// ProbeInterval is how often Hello runs (the peer state); 0: 2s.
	ProbeInterval time.Duration
	// Backoff bounds the reconnect delays; zero: 100ms doubling to 3s.
	Backoff backoff.Config
	// ReconcileMaxDelay bounds the delay between reconcile attempts after
	// one failed (they start at ProbeInterval and double); 0: 1 minute.
	ReconcileMaxDelay time.Duration
	Log               *slog.Logger
}

// PeerState is what the host agent last learnt about its DPU.
type PeerState struct {
	Up    bool
	Err   string
	Hello *apiv1.HelloResponse
	Since time.Time // when Up last changed
	Reconnects,
	Reconciled int // times the link came (back) up / endpoints reconciled then
	// ReconcileErr is why the last reconcile failed while one is pending
	// (retried with backoff until it succeeds).
	ReconcileErr string
}

// Host is the host agent.
type Host struct {
	cfg  HostConfig
	log  *slog.Logger
	conn *grpc.ClientConn
	dpu  apiv1.DPUClient
	api  apiv1.AgentClient // the DPU's agent API (Services, policy)

	mu   sync.Mutex
	peer PeerState
	// A reconcile is due (the link came back) and when to try next.
	reconcile      bool
	reconcileAt    time.Time
	reconcileDelay time.Duration
	// reconcileMu serialises reconciliation with endpoint changes.
	opMu sync.Mutex
}

// NewHost dials the DPU (lazily: gRPC connects, and reconnects with
// exponential backoff, in the background).
func NewHost(cfg HostConfig) (*Host, error) {
	if cfg.DPUAddr == "" || cfg.Creds == nil || cfg.ServerName == "" {
		return nil, errors.New("host agent: the DPU's address, its certificate's name and the link's certificates (mutual TLS) are required")
	}
	if cfg.ReconcileMaxDelay <= 0 {
		cfg.ReconcileMaxDelay = time.Minute
	}
	if cfg.ProbeInterval <= 0 {
		cfg.ProbeInterval = 2 * time.Second
	}
	if cfg.Backoff.MaxDelay == 0 {
		cfg.Backoff = backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 2, Jitter: 0.2, MaxDelay: 3 * time.Second}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	conn, err := grpc.NewClient(cfg.DPUAddr,
		grpc.WithTransportCredentials(credentials.NewTLS(cfg.Creds.ClientConfig(cfg.ServerName))),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: cfg.Backoff, MinConnectTimeout: 3 * time.Second}))
	if err != nil {
		return nil, fmt.Errorf("host agent: dial %s: %w", cfg.DPUAddr, err)
	}
	return &Host{cfg: cfg, log: cfg.Log, conn: conn, dpu: apiv1.NewDPUClient(conn), api: apiv1.NewAgentClient(conn),
		peer: PeerState{Err: "not probed yet", Since: time.Now()}}, nil
}

// do runs fn in the host's namespace.
func (h *Host) do(fn func() error) error {
	if h.cfg.Netns == "" {
		return fn()
	}
	return ns.WithNetNSPath(h.cfg.Netns, func(ns.NetNS) error { return fn() })
}

// Close drops the link.
func (h *Host) Close() error { return h.conn.Close() }

// Peer returns the DPU's state as last probed.
func (h *Host) Peer() PeerState {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.peer
}

// Probe says Hello once and updates the peer state. When the link comes
// (back) up, or the DPU agent restarted, the endpoints are reconciled; a
// reconcile that fails is tried again at the next probes, with a doubling
// delay, until one succeeds.
func (h *Host) Probe(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	resp, err := h.dpu.Hello(ctx, &apiv1.HelloRequest{Host: h.cfg.Name, Version: h.cfg.Version})
	h.mu.Lock()
	was := h.peer.Up
	switch {
	case err != nil:
		if was {
			h.log.Warn("DPU agent unreachable", "addr", h.cfg.DPUAddr, "err", err)
		}
		h.peer.Up, h.peer.Err = false, err.Error()
	default:
		restarted := h.peer.Hello != nil && resp.GetStartedUnix() != h.peer.Hello.GetStartedUnix()
		h.peer.Up, h.peer.Err, h.peer.Hello = true, "", resp
		if !was || restarted {
			h.peer.Reconnects++
			h.log.Info("DPU agent reachable", "addr", h.cfg.DPUAddr, "node", resp.GetNode(), "endpoints", resp.GetEndpointCount(),
				"restarted", restarted)
			h.reconcile, h.reconcileAt, h.reconcileDelay = true, time.Now(), 0
		}
	}
	if was != h.peer.Up {
		h.peer.Since = time.Now()
	}
	due := h.peer.Up && h.reconcile && !time.Now().Before(h.reconcileAt)
	h.mu.Unlock()
	if !due {
		return
	}
	n, err := h.Reconcile(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		h.reconcileDelay = min(max(2*h.reconcileDelay, h.cfg.ProbeInterval), h.cfg.ReconcileMaxDelay)
		h.reconcileAt = time.Now().Add(h.reconcileDelay)
		h.peer.ReconcileErr = err.Error()
		h.log.Warn("reconcile with the DPU failed: retrying", "removed", n, "err", err, "retry_in", h.reconcileDelay)
		return
	}
	h.reconcile, h.peer.ReconcileErr = false, ""
	h.peer.Reconciled++
	h.log.Info("reconciled endpoints with the DPU", "removed", n)
}

// LinkStatus is the host side of the link for `lanekit status` and the
// metrics.
func (h *Host) LinkStatus() *apiv1.DPULinkStatus {
	st := &apiv1.DPULinkStatus{Role: "host", PeerIdentity: h.cfg.ServerName, Certificates: h.cfg.Creds.Certificates()}
	if err := h.cfg.Creds.ReloadError(); err != nil {
		st.ReloadError = err.Error()
	}
	return st
}

// Reconcile compares the DPU's endpoints with this host: an endpoint whose
// pod namespace is gone (deleted while the link was down) is deleted on the
// DPU; one whose VF is not configured in its pod is logged (CHECK reports
// it to the runtime). It returns how many it deleted.
func (h *Host) Reconcile(ctx context.Context) (int, error) {
	h.opMu.Lock()
	defer h.opMu.Unlock()
	list, err := h.dpu.ListEndpoints(ctx, &apiv1.ListEndpointsRequest{})
	if err != nil {
		return 0, fmt.Errorf("reconcile: %w", err)
	}
	n := 0
	var errs []error
	for _, de := range list.GetEndpoints() {
		ep := de.GetEndpoint()
		if ep.GetKind() == apiv1.EndpointKind_ENDPOINT_KIND_VM {
			continue // a VM's device namespace is the DPU's (CreateVM): DelVM removes it
		}
		if _, err := os.Stat(ep.GetNetns()); err == nil {
			if err := checkPodSide(de); err != nil {
				h.log.Warn("endpoint's VF not in place", "attachment", ep.GetAttachment(), "err", err)
			}
			continue
		}
		h.log.Info("pod gone while the DPU link was down: deleting its endpoint", "attachment", ep.GetAttachment(), "netns", ep.GetNetns())
		if _, err := h.dpu.DeleteEndpoint(ctx, &apiv1.DelEndpointRequest{Attachment: ep.GetAttachment(), Netns: ep.GetNetns()}); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// Run serves the agent API on the unix socket and probes the DPU until ctx
// is done.
func (h *Host) Run(ctx context.Context) error {
	lis, err := listenUnix(h.cfg.Socket)
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	apiv1.RegisterAgentServer(srv, &hostAPI{h: h})
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	go func() {
		t := time.NewTicker(h.cfg.ProbeInterval)
		defer t.Stop()
		for {
			h.Probe(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	h.log.Info("host agent serving", "socket", h.cfg.Socket, "dpu", h.cfg.DPUAddr)
	select {
	case <-ctx.Done():
		srv.GracefulStop()
		<-errc
		return nil
	case err := <-errc:
		return fmt.Errorf("serve %s: %w", h.cfg.Socket, err)
	}
}

// listenUnix listens on path, mode 0600, replacing a stale socket.
func listenUnix(path string) (net.Listener, error) {
	if path == "" {
		return nil, errors.New("listen: socket path is required")
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("listen on %s: exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
	}
	old := syscall.Umask(0o177)
	lis, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return lis, nil
}
