package kubevirt

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lanekit/lanekit/pkg/kubevirt/hooks/info"
	"github.com/lanekit/lanekit/pkg/kubevirt/hooks/v1alpha3"
)

// HooksDir is where virt-launcher looks for hook sidecar sockets; every
// file in it must be a hook gRPC socket.
const HooksDir = "/var/run/kubevirt-hooks"

// Hook point names and the Callbacks version, as virt-launcher spells them.
const (
	HookOnDefineDomain = "OnDefineDomain"
	HookShutdown       = "Shutdown"
	CallbacksVersion   = "v1alpha3"
)

// Server is the binding plugin's hook server.
type Server struct {
	Binding string      // binding plugin name (BindingName by default)
	Source  *InfoSource // where the sockets come from
	Log     *slog.Logger
	done    chan struct{}
	once    sync.Once
	info.UnimplementedInfoServer
	v1alpha3.UnimplementedCallbacksServer
}

// NewServer returns a hook server for the named binding reading network-info
// from src.
func NewServer(binding string, src *InfoSource, log *slog.Logger) *Server {
	if binding == "" {
		binding = BindingName
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{Binding: binding, Source: src, Log: log, done: make(chan struct{})}
}

// Done is closed when virt-launcher calls Shutdown.
func (s *Server) Done() <-chan struct{} { return s.done }

// Info tells virt-launcher which hook points and versions this server has.
func (s *Server) Info(context.Context, *info.InfoParams) (*info.InfoResult, error) {
	return &info.InfoResult{
		Name:     s.Binding,
		Versions: []string{CallbacksVersion},
		HookPoints: []*info.HookPoint{
			{Name: HookOnDefineDomain, Priority: 0},
			{Name: HookShutdown, Priority: 0},
		},
	}, nil
}

// OnDefineDomain rewrites the domain XML for the VMI's lanekit interfaces.
func (s *Server) OnDefineDomain(ctx context.Context, p *v1alpha3.OnDefineDomainParams) (*v1alpha3.OnDefineDomainResult, error) {
	out, err := s.define(ctx, p.GetDomainXML(), p.GetVmi())
	if err != nil {
		s.Log.Error("OnDefineDomain", "err", err)
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	return &v1alpha3.OnDefineDomainResult{DomainXML: out}, nil
}

func (s *Server) define(ctx context.Context, domain, vmiJSON []byte) ([]byte, error) {
	vmi, err := ParseVMI(vmiJSON)
	if err != nil {
		return nil, err
	}
	var nets []string
	for _, i := range vmi.BoundInterfaces(s.Binding) {
		nets = append(nets, i.Name)
	}
	if len(nets) == 0 {
		return nil, fmt.Errorf("vmi %s/%s: no interface uses the %q binding", vmi.Metadata.Namespace, vmi.Metadata.Name, s.Binding)
	}
	mig, err := vmi.Migration()
	if err != nil {
		return nil, err
	}
	target := mig != nil && mig.InProgress() && mig.TargetPod != ""
	socks, err := s.Source.Sockets(ctx, nets)
	if err != nil {
		if target {
			// kubevirt#15634: KubeVirt did not give the target launcher
			// pod the network-info of its own network-status. Without it
			// there is no socket to point QEMU at; defining the domain
			// without the interface would migrate a guest that lost its NIC.
			return nil, fmt.Errorf("migration target pod %s/%s on node %s (%s): %w: the target pod's kubevirt.io/network-info annotation must carry the device-info the lanekit CNI reported in this pod's network-status (kubevirt#15634); refusing to define the domain without the %v interface(s)",
				vmi.Metadata.Namespace, mig.TargetPod, mig.TargetNode, mig, err, nets)
		}
		return nil, err
	}
	atts, err := Plan(vmi, s.Binding, socks)
	if err != nil {
		return nil, err
	}
	out, err := Rewrite(domain, atts)
	if err != nil {
		return nil, err
	}
	role := "start"
	if target {
		role = "migration-target"
	}
	for _, a := range atts {
		s.Log.Info("vhost-user interface", "vmi", vmi.Metadata.Namespace+"/"+vmi.Metadata.Name, "interface", a.Name,
			"socket", a.Socket, "mode", a.Mode, "mac", a.MAC, "queues", a.Queues, "define", role)
	}
	return out, nil
}

// PreCloudInitIso hands cloud-init data back unchanged.
func (s *Server) PreCloudInitIso(_ context.Context, p *v1alpha3.PreCloudInitIsoParams) (*v1alpha3.PreCloudInitIsoResult, error) {
	return &v1alpha3.PreCloudInitIsoResult{CloudInitData: p.GetCloudInitData(), CloudInitNoCloudSource: p.GetCloudInitNoCloudSource()}, nil
}

// Shutdown is virt-launcher telling the sidecar the VM is gone.
func (s *Server) Shutdown(context.Context, *v1alpha3.ShutdownParams) (*v1alpha3.ShutdownResult, error) {
	s.once.Do(func() { close(s.done) })
	return &v1alpha3.ShutdownResult{}, nil
}

// Serve listens on socket (removing a stale file first) and serves until ctx
// ends or virt-launcher calls Shutdown.
func (s *Server) Serve(ctx context.Context, socket string) error {
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		return fmt.Errorf("hook socket dir: %w", err)
	}
	if err := os.Remove(socket); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove stale hook socket: %w", err)
	}
	lis, err := (&net.ListenConfig{}).Listen(ctx, "unix", socket)
	if err != nil {
		return fmt.Errorf("listen on hook socket: %w", err)
	}
	defer os.Remove(socket)
	g := grpc.NewServer()
	info.RegisterInfoServer(g, s)
	v1alpha3.RegisterCallbacksServer(g, s)
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(lis) }()
	s.Log.Info("serving kubevirt hooks", "socket", socket, "binding", s.Binding, "version", CallbacksVersion)
	select {
	case err := <-errc:
		return fmt.Errorf("serve hooks: %w", err)
	case <-ctx.Done():
	case <-s.done:
		s.Log.Info("shutdown requested by virt-launcher")
	}
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		g.Stop()
	}
	return nil
}
