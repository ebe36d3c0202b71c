package dpu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"google.golang.org/protobuf/proto"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/vf"
)

// Server is the DPU agent's side of the link: the DPU service (endpoints
// with their VFs, Hello) and the agent API (Services, policy, status) on
// TCP with mutual TLS. Every call must come from the one host it serves
// (HostIdentity) and be one a host may make (hostCalls, auth.go).
type Server struct {
	apiv1.UnimplementedDPUServer
	API     apiv1.AgentServer // agent.NewAPIServer of the DPU's agent
	Reps    vf.Representors
	Node    string // this DPU's name in Hello
	Version string
	Log     *slog.Logger
	// VMNetns places the DPU side of VM endpoints (CreateVM); an empty Dir
	// refuses VMs.
	VMNetns VMNetns
	// Creds are the link's certificate, key and CA (read again when the
	// files change).
	Creds *Creds
	// HostIdentity is the host this DPU serves: its certificate must carry
	// it as a DNS or URI SAN or as its CN, on every call (CertNames).
	HostIdentity string
	// HostObjects lets the host apply and delete objects (Services,
	// policy): only when the DPU agent has no Kubernetes source.
	HostObjects bool
	// MaxConnectionAge recycles the host's connection (gracefully: GOAWAY,
	// the host reconnects) so that rotated certificates, this side's and
	// the host's, are in use within it rather than at the next outage;
	// 0: DefaultMaxConnectionAge.
	MaxConnectionAge time.Duration

	started time.Time
	mu      sync.Mutex
	host    string // the last host that said Hello, and its certificate's name
	hostCN  string
	seen    time.Time
	// refused calls and the last refusal (LinkStatus).
	refused     uint64
	lastRefusal string
	// register adds services to the link's server (tests: a streaming one).
	register func(*grpc.Server)
}

// DefaultMaxConnectionAge is Server.MaxConnectionAge's default.
const DefaultMaxConnectionAge = 10 * time.Minute

// Serve listens on addr until ctx is done.
func (s *Server) Serve(ctx context.Context, addr string) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("dpu listen %s: %w", addr, err)
	}
	return s.ServeListener(ctx, lis)
}

// ServeListener serves on lis (tests pick the port).
func (s *Server) ServeListener(ctx context.Context, lis net.Listener) error {
	if s.Creds == nil || s.HostIdentity == "" {
		lis.Close()
		return errors.New("dpu link: the certificates and the identity of the host it serves are required")
	}
	s.started = time.Now()
	age := s.MaxConnectionAge
	if age <= 0 {
		age = DefaultMaxConnectionAge
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(s.Creds.ServerConfig())),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: age, MaxConnectionAgeGrace: opTimeout}),
		grpc.ChainUnaryInterceptor(s.unaryAuth), grpc.ChainStreamInterceptor(s.streamAuth))
	apiv1.RegisterDPUServer(srv, s)
	apiv1.RegisterAgentServer(srv, s.API)
	if s.register != nil {
		s.register(srv)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	s.logger().Info("serving the DPU link", "addr", lis.Addr().String(), "host_identity", s.HostIdentity)
	select {
	case <-ctx.Done():
		srv.Stop()
		<-errc
		return nil
	case err := <-errc:
		return fmt.Errorf("dpu serve %s: %w", lis.Addr(), err)
	}
}

func (s *Server) logger() *slog.Logger {
	if s.Log == nil {
		return slog.Default()
	}
	return s.Log
}

// Location is what the DPU agent's Status says about where the datapath
// runs and the host it serves.
func (s *Server) Location() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.host == "" {
		return fmt.Sprintf("dpu %s: no host agent has connected", s.Node)
	}
	return fmt.Sprintf("dpu %s for host %s (certificate %q), last hello %s ago", s.Node, s.host, s.hostCN,
		time.Since(s.seen).Round(time.Second))
}

// Hello records the host and reports the DPU's state.
func (s *Server) Hello(ctx context.Context, req *apiv1.HelloRequest) (*apiv1.HelloResponse, error) {
	cn := ""
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
			cn = ti.State.PeerCertificates[0].Subject.CommonName
		}
	}
	s.mu.Lock()
	if s.host != req.GetHost() {
		s.logger().Info("host agent connected", "host", req.GetHost(), "cert", cn, "version", req.GetVersion())
	}
	s.host, s.hostCN, s.seen = req.GetHost(), cn, time.Now()
	s.mu.Unlock()
	st, err := s.API.Status(ctx, &apiv1.StatusRequest{})
	if err != nil {
		return nil, err
	}
	return &apiv1.HelloResponse{
		Node: s.Node, Version: s.Version, PodCidr: st.GetPodCidr(), Ready: st.GetReady(), Reason: st.GetReason(),
		EndpointCount: st.GetEndpointCount(), VfKind: s.Reps.Kind(), StartedUnix: s.started.Unix(),
		Mtu: st.GetRouting().GetPodMtu(),
	}, nil
}

// vfOf describes the VF of an endpoint (interfaces[0] is the representor,
// interfaces[1] the VF).
func (s *Server) vfOf(ep *apiv1.Endpoint) *apiv1.VF {
	ifs := ep.GetInterfaces()
	if len(ifs) < 2 {
		return nil
	}
	mac, _ := net.ParseMAC(ifs[1].GetMac())
	v := s.Reps.Describe(ifs[0].GetName(), mac)
	return &apiv1.VF{Kind: v.Kind, Index: v.Index, HostName: v.HostName, Mac: ifs[1].GetMac(), Representor: v.Representor}
}

// CreateEndpoint adds the endpoint through the agent (address, VF and
// representor, datapath entry) and says which VF the host moves.
func (s *Server) CreateEndpoint(ctx context.Context, req *apiv1.AddEndpointRequest) (*apiv1.DPUEndpoint, error) {
	if req.GetKind() == apiv1.EndpointKind_ENDPOINT_KIND_VM {
		return nil, status.Error(codes.Unimplemented, "VM endpoints on a DPU node are not supported yet")
	}
	resp, err := s.API.AddEndpoint(ctx, req)
	if err != nil {
		return nil, err
	}
	return &apiv1.DPUEndpoint{Endpoint: resp.GetEndpoint(), Vf: s.vfOf(resp.GetEndpoint())}, nil
}

// DeleteEndpoint removes the endpoint and gives its VF back.
func (s *Server) DeleteEndpoint(ctx context.Context, req *apiv1.DelEndpointRequest) (*apiv1.DelEndpointResponse, error) {
	return s.API.DelEndpoint(ctx, req)
}

// CheckEndpoint checks the DPU side of an endpoint.
func (s *Server) CheckEndpoint(ctx context.Context, req *apiv1.CheckEndpointRequest) (*apiv1.DPUEndpoint, error) {
	resp, err := s.API.CheckEndpoint(ctx, req)
	if err != nil {
		return nil, err
	}
	return &apiv1.DPUEndpoint{Endpoint: resp.GetEndpoint(), Vf: s.vfOf(resp.GetEndpoint())}, nil
}

// ListEndpoints lists the endpoints with their VFs and counters.
func (s *Server) ListEndpoints(ctx context.Context, req *apiv1.ListEndpointsRequest) (*apiv1.ListDPUEndpointsResponse, error) {
	resp, err := s.API.ListEndpoints(ctx, req)
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListDPUEndpointsResponse{}
	for _, ep := range resp.GetEndpoints() {
		out.Endpoints = append(out.Endpoints, &apiv1.DPUEndpoint{Endpoint: ep, Vf: s.vfOf(ep)})
	}
	return out, nil
}

// GC removes the endpoints of attachments the host no longer has.
func (s *Server) GC(ctx context.Context, req *apiv1.GCRequest) (*apiv1.GCResponse, error) {
	return s.API.GC(ctx, req)
}

// CreateVM adds the VM endpoint in the DPU's agent with the VM's device in a
// namespace of its own on the DPU (VMNetns): the device, its steering
// program and AF_XDP sockets, the representor's programs and the sockets'
// server all run here, the VM's QEMU on the host (req.netns). The backend
// fetches the AF_XDP sockets from the returned VM's socket on the DPU.
func (s *Server) CreateVM(ctx context.Context, req *apiv1.AddVMRequest) (*apiv1.DPUVM, error) {
	if s.VMNetns.Dir == "" {
		return nil, status.Error(codes.FailedPrecondition, "this DPU agent places no VMs (--vm-netns-dir is empty)")
	}
	if err := endpoint.ValidateVMName(req.GetName()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if req.GetIncoming() {
		return nil, status.Error(codes.Unimplemented, "live migration to or from a DPU node is not supported")
	}
	path, err := s.VMNetns.Create(req.GetName())
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	dreq := proto.Clone(req).(*apiv1.AddVMRequest)
	dreq.Netns = path
	resp, err := s.API.AddVM(ctx, dreq)
	if err != nil {
		if status.Code(err) != codes.AlreadyExists {
			if derr := s.VMNetns.Delete(req.GetName()); derr != nil {
				s.logger().Warn("undo the VM's namespace", "vm", req.GetName(), "err", derr)
			}
		}
		return nil, err
	}
	s.logger().Info("vm placed on the DPU", "vm", req.GetName(), "device_netns", path, "host_netns", req.GetNetns(),
		"socket", resp.GetVm().GetSocket())
	return &apiv1.DPUVM{Vm: resp.GetVm(), DeviceNetns: path, HostNetns: req.GetNetns()}, nil
}

// DeleteVM removes the VM endpoint and its device's namespace.
func (s *Server) DeleteVM(ctx context.Context, req *apiv1.DelVMRequest) (*apiv1.DelVMResponse, error) {
	resp, err := s.API.DelVM(ctx, req)
	if err != nil {
		return nil, err
	}
	if s.VMNetns.Dir != "" {
		if err := s.VMNetns.Delete(req.GetName()); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	return resp, nil
}
