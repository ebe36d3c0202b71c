package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/netdev"
)

// listen creates the unix socket (mode 0600, replacing a stale socket file)
// and the gRPC server.
func (a *Agent) listen() (*grpc.Server, net.Listener, error) {
	path := a.cfg.Socket
	if path == "" {
		return nil, nil, errors.New("listen: socket path is required")
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, nil, fmt.Errorf("listen on %s: exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
	}
	if err := os.MkdirAll(dirOf(path), 0o755); err != nil {
		return nil, nil, fmt.Errorf("create socket dir for %s: %w", path, err)
	}
	old := syscall.Umask(0o177)
	lis, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		lis.Close()
		return nil, nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	opts := append([]grpc.ServerOption{grpc.MaxRecvMsgSize(apiv1.MaxMessage), grpc.MaxSendMsgSize(apiv1.MaxMessage)}, a.cfg.ServerOptions...)
	srv := grpc.NewServer(opts...)
	apiv1.RegisterAgentServer(srv, &server{a: a})
	if a.cfg.ExtraServices != nil {
		a.cfg.ExtraServices(srv)
	}
	return srv, lis, nil
}

func dirOf(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			if i == 0 {
				return "/"
			}
			return p[:i]
		}
	}
	return "."
}

func stopGracefully(srv *grpc.Server) {
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		srv.Stop()
	}
}

// server adapts the Agent to the generated gRPC interface.
type server struct {
	apiv1.UnimplementedAgentServer
	a *Agent
}

// statusErr maps the agent's error classes to gRPC codes.
func statusErr(err error) error {
	if err == nil {
		return nil
	}
	code := codes.Internal
	switch {
	case errors.Is(err, ErrInvalid):
		code = codes.InvalidArgument
	case errors.Is(err, ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, ErrConflict):
		code = codes.AlreadyExists
	case errors.Is(err, ErrBadNetns), errors.Is(err, ErrNotReady):
		code = codes.FailedPrecondition
	case errors.Is(err, ErrUnavailable):
		code = codes.Unavailable
	case errors.Is(err, ErrExhausted), errors.Is(err, ErrPolicyFull):
		code = codes.ResourceExhausted
	case errors.Is(err, datapath.ErrNotSupported):
		code = codes.Unimplemented
	}
	return status.Error(code, err.Error())
}

func kindFromProto(k apiv1.EndpointKind) (endpoint.Kind, error) {
	switch k {
	case apiv1.EndpointKind_ENDPOINT_KIND_UNSPECIFIED, apiv1.EndpointKind_ENDPOINT_KIND_POD:
		return endpoint.KindPod, nil
	case apiv1.EndpointKind_ENDPOINT_KIND_VM:
		return endpoint.KindVM, nil
	}
	return "", fmt.Errorf("endpoint kind %v: %w", k, ErrInvalid)
}

func kindToProto(k endpoint.Kind) apiv1.EndpointKind {
	if k == endpoint.KindVM {
		return apiv1.EndpointKind_ENDPOINT_KIND_VM
	}
	return apiv1.EndpointKind_ENDPOINT_KIND_POD
}

// EndpointToProto converts a stored endpoint to its API form:
// interfaces[0] host side, interfaces[1] pod side.
func EndpointToProto(ep *endpoint.Endpoint) *apiv1.Endpoint {
	out := &apiv1.Endpoint{
		Id:         ep.ID,
		Kind:       kindToProto(ep.Kind),
		Attachment: &apiv1.Attachment{ContainerId: ep.ContainerID, Ifname: ep.IfName},
		Netns:      ep.Netns,
		Network:    ep.Network,
		DeviceMode: string(ep.Mode),
		Interfaces: []*apiv1.Interface{
			{Name: ep.HostIfName, Mac: ep.HostMAC, Ifindex: int32(ep.HostIfIndex), Mtu: uint32(ep.MTU)},
			{Name: ep.IfName, Mac: ep.MAC, Sandbox: ep.Netns, Ifindex: int32(ep.IfIndex), Mtu: uint32(ep.MTU)},
		},
		Ips: []*apiv1.IPConfig{
			{Address: ep.IP.String() + "/32", Gateway: endpoint.GatewayIP.String(), Interface: 1},
		},
		Routes: []*apiv1.Route{
			{Dst: endpoint.GatewayIP.String() + "/32", Scope: 253}, // RT_SCOPE_LINK
			{Dst: "0.0.0.0/0", Gateway: endpoint.GatewayIP.String()},
		},
		Labels:      ep.Labels,
		CreatedUnix: ep.Created.Unix(),
	}
	if !ep.IP.IsValid() { // an IPv6-only node
		out.Ips, out.Routes = nil, nil
	}
	addIPv6ToProto(ep, out) // ipv6.go
	return out
}

func attachmentOf(at *apiv1.Attachment) (string, string) {
	if at == nil {
		return "", ""
	}
	return at.GetContainerId(), at.GetIfname()
}

func (s *server) AddEndpoint(_ context.Context, req *apiv1.AddEndpointRequest) (*apiv1.AddEndpointResponse, error) {
	kind, err := kindFromProto(req.GetKind())
	if err != nil {
		return nil, statusErr(err)
	}
	cid, ifname := attachmentOf(req.GetAttachment())
	if kind == endpoint.KindVM {
		vu := req.GetVhostUser()
		if vu == nil {
			return nil, statusErr(fmt.Errorf("add %s/%s: kind vm needs vhost_user (or use AddVM): %w", cid, ifname, ErrInvalid))
		}
		va, err := s.a.AttachVM(VMAttachRequest{
			ContainerID: cid, IfName: ifname, Netns: req.GetNetns(), Network: req.GetNetwork(), Labels: req.GetLabels(),
			Queues: int(vu.GetQueues()), MAC: vu.GetMac(), MTU: int(req.GetMtu()),
			SocketDir: vu.GetSocketDir(), PodVolume: vu.GetPodVolume(), HostSocketDir: vu.GetHostSocketDir(),
		})
		if err != nil {
			return nil, statusErr(err)
		}
		return &apiv1.AddEndpointResponse{Endpoint: vmAttachmentEndpoint(va), VhostUser: vhostUserDevice(va)}, nil
	}
	ep, err := s.a.Add(AddRequest{
		Kind: kind, ContainerID: cid, IfName: ifname, Netns: req.GetNetns(), Network: req.GetNetwork(),
		MTU: int(req.GetMtu()), Subnet: req.GetSubnet(), Labels: req.GetLabels(),
	})
	if err != nil {
		return nil, statusErr(err)
	}
	return &apiv1.AddEndpointResponse{Endpoint: EndpointToProto(ep)}, nil
}

func (s *server) DelEndpoint(_ context.Context, req *apiv1.DelEndpointRequest) (*apiv1.DelEndpointResponse, error) {
	cid, ifname := attachmentOf(req.GetAttachment())
	var existed bool
	var err error
	if req.GetKind() != apiv1.EndpointKind_ENDPOINT_KIND_VM {
		existed, err = s.a.Del(cid, ifname)
	}
	if err == nil && !existed {
		// A VM attachment (or a DEL whose config lost "vhostUser").
		existed, err = s.a.DetachVM(cid, ifname)
	}
	if err != nil {
		return nil, statusErr(err)
	}
	return &apiv1.DelEndpointResponse{Existed: existed}, nil
}

func (s *server) CheckEndpoint(_ context.Context, req *apiv1.CheckEndpointRequest) (*apiv1.CheckEndpointResponse, error) {
	cid, ifname := attachmentOf(req.GetAttachment())
	if req.GetKind() == apiv1.EndpointKind_ENDPOINT_KIND_VM {
		va, err := s.a.CheckVMAttachment(cid, ifname, req.GetNetns())
		if err != nil {
			return nil, statusErr(err)
		}
		return &apiv1.CheckEndpointResponse{Endpoint: vmAttachmentEndpoint(va), VhostUser: vhostUserDevice(va)}, nil
	}
	ep, err := s.a.Check(cid, ifname, req.GetNetns())
	if err != nil {
		return nil, statusErr(err)
	}
	return &apiv1.CheckEndpointResponse{Endpoint: EndpointToProto(ep)}, nil
}

func (s *server) ListEndpoints(context.Context, *apiv1.ListEndpointsRequest) (*apiv1.ListEndpointsResponse, error) {
	eps, err := s.a.List()
	if err != nil {
		return nil, statusErr(err)
	}
	ids := make([]uint32, len(eps))
	for i := range eps {
		ids[i] = eps[i].ID
	}
	counters, cerr := s.a.CountersOf(ids)
	resp := &apiv1.ListEndpointsResponse{}
	for i := range eps {
		pe := EndpointToProto(&eps[i])
		if cerr == nil {
			pe.Counters = CountersToProto(counters[eps[i].ID])
		}
		if pi, ok := s.a.PolicyInfoOf(eps[i].ID); ok {
			pe.Policy = EndpointPolicyToProto(pi)
		}
		resp.Endpoints = append(resp.Endpoints, pe)
	}
	return resp, nil
}

func (s *server) GC(_ context.Context, req *apiv1.GCRequest) (*apiv1.GCResponse, error) {
	var valid []Attachment
	for _, at := range req.GetValidAttachments() {
		valid = append(valid, Attachment{at.GetContainerId(), at.GetIfname()})
	}
	removed, err := s.a.GC(valid)
	if err != nil {
		return nil, statusErr(err)
	}
	resp := &apiv1.GCResponse{}
	for _, r := range removed {
		resp.Removed = append(resp.Removed, &apiv1.Attachment{ContainerId: r.ContainerID, Ifname: r.IfName})
	}
	return resp, nil
}

func feature(f netdev.Feature) *apiv1.Feature {
	return &apiv1.Feature{Supported: f.Supported, Detail: f.Detail}
}

func (s *server) Status(context.Context, *apiv1.StatusRequest) (*apiv1.StatusResponse, error) {
	st, err := s.a.Status()
	if err != nil {
		return nil, statusErr(err)
	}
	f := st.Features
	location := "local"
	if s.a.cfg.DatapathLocation != nil {
		location = s.a.cfg.DatapathLocation()
	}
	return &apiv1.StatusResponse{
		Version: st.Version,
		Datapath: &apiv1.DatapathStatus{
			Backend: st.Backend, Location: location,
			DeviceMode: string(st.DeviceMode), DeviceModeReason: st.DeviceModeReason,
			CounterEntries: uint32(st.MetricsEntries), CounterCapacity: uint32(st.MetricsCapacity),
			CounterUpdatesLost: st.MetricsLost,
		},
		Kernel: &apiv1.KernelFeatures{
			Release: f.Release,
			Tcx:     feature(f.TCX), Netkit: feature(f.Netkit), Bpffs: feature(f.BPFFS), Btf: feature(f.BTF),
		},
		PodCidr:       st.PodCIDR.String(),
		EndpointCount: uint32(st.Endpoints),
		Ready:         st.Ready,
		Reason:        st.NotReadyReason,
		IpsAllocated:  uint32(st.IPsAllocated),
		IpsCapacity:   uint32(st.IPsCapacity),
		ControlPlane:  ControlPlaneToProto(s.a.ControlStats()),
		Routing:       RoutingToProto(st.Routing),
	}, nil
}

// VMToProto converts a VM endpoint to its API form.
func VMToProto(v *VMInfo) *apiv1.VM {
	ep := &v.Endpoint
	out := &apiv1.VM{
		Address: ep.IP.String() + "/32", Gateway: endpoint.GatewayIP.String(), Mac: ep.MAC,
		Mtu: uint32(ep.MTU), Serving: v.Serving, Endpoint: EndpointToProto(ep),
	}
	if !ep.IP.IsValid() { // an IPv6-only node: the endpoint's IP configs
		out.Address, out.Gateway = "", ""
	}
	if ep.VM != nil {
		out.Name, out.Queues, out.Socket, out.XskBase = ep.VM.Name, uint32(ep.VM.Queues), ep.VM.Socket, ep.VM.XSKBase
		if b := ep.VM.Backend; b != nil {
			out.Backend = &apiv1.VMBackend{HostSocket: filepath.Join(b.HostDir, b.File), Socket: b.ReportedPath, MetricsSocket: b.MetricsSocket}
			if v.Backend != nil {
				out.Backend.Pid, out.Backend.Restarts = int32(v.Backend.PID), v.Backend.Restarts
			}
			if at := ep.VM.Attachment; at != nil {
				out.Backend.Attachment = &apiv1.Attachment{ContainerId: at.ContainerID, Ifname: at.IfName}
			}
		}
		migrationToProto(out, ep.VM.Migration)
	}
	return out
}

// vmAttachmentEndpoint is a VM attachment as a CNI endpoint: the VM's
// device and address, no routes (a secondary network: the pod keeps its
// own).
func vmAttachmentEndpoint(va *VMAttachment) *apiv1.Endpoint {
	pe := EndpointToProto(&va.VM.Endpoint)
	pe.Routes = nil
	for _, ipc := range pe.Ips {
		ipc.Gateway = ""
	}
	return pe
}

func vhostUserDevice(va *VMAttachment) *apiv1.VhostUserDevice {
	return &apiv1.VhostUserDevice{Mode: va.Mode, Path: va.Path, VmName: va.VM.Endpoint.VM.Name}
}

func (s *server) AddVM(_ context.Context, req *apiv1.AddVMRequest) (*apiv1.AddVMResponse, error) {
	r := AddVMRequest{
		Name: req.GetName(), Netns: req.GetNetns(), Queues: int(req.GetQueues()), MAC: req.GetMac(),
		MTU: int(req.GetMtu()), Labels: req.GetLabels(), SocketUID: req.SocketUid, SocketGID: req.SocketGid,
		Incoming: req.GetIncoming(), Generation: req.GetGeneration(), GatewayMAC: req.GetGatewayMac(),
	}
	if req.GetAddress() != "" {
		var err error
		if r.Address, err = parseVMAddress(req.GetAddress()); err != nil {
			return nil, statusErr(err)
		}
	}
	if req.GetAddress6() != "" {
		var err error
		if r.Address6, err = parseVMAddress(req.GetAddress6()); err != nil {
			return nil, statusErr(err)
		}
	}
	v, err := s.a.AddVM(r)
	if err != nil {
		return nil, statusErr(err)
	}
	return &apiv1.AddVMResponse{Vm: VMToProto(v)}, nil
}

func (s *server) DelVM(_ context.Context, req *apiv1.DelVMRequest) (*apiv1.DelVMResponse, error) {
	existed, err := s.a.DelVM(req.GetName())
	if err != nil {
		return nil, statusErr(err)
	}
	return &apiv1.DelVMResponse{Existed: existed}, nil
}

func (s *server) ListVMs(context.Context, *apiv1.ListVMsRequest) (*apiv1.ListVMsResponse, error) {
	vms, err := s.a.ListVMs()
	if err != nil {
		return nil, statusErr(err)
	}
	resp := &apiv1.ListVMsResponse{}
	for i := range vms {
		resp.Vms = append(resp.Vms, VMToProto(&vms[i]))
	}
	return resp, nil
}

// CountersToProto converts datapath counters.
func CountersToProto(c datapath.Counters) *apiv1.EndpointCounters {
	pc := &apiv1.EndpointCounters{FromPackets: c.FromPackets, FromBytes: c.FromBytes, ToPackets: c.ToPackets, ToBytes: c.ToBytes,
		StackPackets: c.StackPackets, StackBytes: c.StackBytes}
	for r, n := range c.Drops {
		if pc.Drops == nil {
			pc.Drops = map[string]uint64{}
		}
		pc.Drops[r.String()] = n
	}
	return pc
}
