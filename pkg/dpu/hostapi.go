package dpu

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/vf"
)

// opTimeout bounds one call to the DPU: a CNI ADD that cannot reach it
// fails with Unavailable/DeadlineExceeded (CNI code 11, try again).
const opTimeout = 15 * time.Second

// hostAPI is the agent API on the host: the CNI plugin's calls become DPU
// calls plus the VF's move into the pod; the rest goes to the DPU's agent.
type hostAPI struct {
	apiv1.UnimplementedAgentServer
	h *Host
}

// podOf is how the host configures the VF of de inside its pod.
func podOf(de *apiv1.DPUEndpoint) (vf.Pod, error) {
	ep := de.GetEndpoint()
	p := vf.Pod{Netns: ep.GetNetns()}
	if ifs := ep.GetInterfaces(); len(ifs) > 1 {
		p.IfName, p.MTU = ifs[1].GetName(), int(ifs[1].GetMtu())
	}
	for _, ipc := range ep.GetIps() {
		pfx, err := netip.ParsePrefix(ipc.GetAddress())
		if err != nil {
			return p, fmt.Errorf("endpoint address %q: %w", ipc.GetAddress(), err)
		}
		if pfx.Addr().Is4() {
			p.IP = pfx.Addr()
		} else {
			p.IP6 = pfx.Addr()
		}
	}
	if p.IfName == "" || !p.IP.IsValid() {
		return p, fmt.Errorf("the DPU's endpoint lacks the pod's interface or address")
	}
	return p, nil
}

// hostName is the VF's netdev on this host before it moves.
func (h *Host) hostName(v *apiv1.VF) (string, error) {
	switch v.GetKind() {
	case vf.KindVeth:
		return v.GetHostName(), nil
	case vf.KindSRIOV:
		if h.cfg.VFPF == "" {
			return "", fmt.Errorf("the DPU hands out SR-IOV VFs: the host agent needs --vf-pf")
		}
		return vf.HostVFName(h.cfg.Sysfs, h.cfg.VFPF, v.GetIndex())
	}
	return "", fmt.Errorf("unknown VF kind %q", v.GetKind())
}

func checkPodSide(de *apiv1.DPUEndpoint) error {
	p, err := podOf(de)
	if err != nil {
		return err
	}
	mac, _ := net.ParseMAC(de.GetVf().GetMac())
	return vf.CheckPod(p, mac)
}

func (s *hostAPI) AddEndpoint(ctx context.Context, req *apiv1.AddEndpointRequest) (*apiv1.AddEndpointResponse, error) {
	if req.GetKind() == apiv1.EndpointKind_ENDPOINT_KIND_VM {
		return nil, status.Error(codes.Unimplemented, "VM attachments on a DPU node are not supported yet")
	}
	if err := checkNetnsFile(req.GetNetns()); err != nil {
		return nil, err
	}
	s.h.opMu.Lock()
	defer s.h.opMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	de, err := s.h.dpu.CreateEndpoint(ctx, req)
	if err != nil {
		return nil, err // the DPU's code: Unavailable when it is down
	}
	out := &apiv1.AddEndpointResponse{Endpoint: de.GetEndpoint()}
	if checkPodSide(de) == nil {
		return out, nil // a repeated ADD: the VF is in place
	}
	undo := func(cause error) error {
		_, derr := s.h.dpu.DeleteEndpoint(ctx, &apiv1.DelEndpointRequest{Attachment: req.GetAttachment(), Netns: req.GetNetns()})
		if derr != nil {
			return status.Errorf(codes.Internal, "%v; undo on the DPU: %v", cause, derr)
		}
		return status.Error(codes.Internal, cause.Error())
	}
	p, err := podOf(de)
	if err != nil {
		return nil, undo(err)
	}
	name, err := s.h.hostName(de.GetVf())
	if err != nil {
		return nil, undo(err)
	}
	var idx int
	err = s.h.do(func() error {
		var err error
		idx, err = vf.AttachPod(name, p)
		return err
	})
	if err != nil {
		return nil, undo(err)
	}
	if ifs := out.GetEndpoint().GetInterfaces(); len(ifs) > 1 {
		ifs[1].Ifindex = int32(idx)
	}
	return out, nil
}

func (s *hostAPI) findEndpoint(ctx context.Context, at *apiv1.Attachment) (*apiv1.DPUEndpoint, error) {
	list, err := s.h.dpu.ListEndpoints(ctx, &apiv1.ListEndpointsRequest{})
	if err != nil {
		return nil, err
	}
	for _, de := range list.GetEndpoints() {
		got := de.GetEndpoint().GetAttachment()
		if got.GetContainerId() == at.GetContainerId() && got.GetIfname() == at.GetIfname() {
			return de, nil
		}
	}
	return nil, nil
}

func (s *hostAPI) DelEndpoint(ctx context.Context, req *apiv1.DelEndpointRequest) (*apiv1.DelEndpointResponse, error) {
	s.h.opMu.Lock()
	defer s.h.opMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	de, err := s.findEndpoint(ctx, req.GetAttachment())
	if err != nil {
		return nil, err
	}
	if de != nil && de.GetVf().GetKind() == vf.KindSRIOV {
		// The VF goes back to the host before the DPU hands it out again.
		if name, err := s.h.hostName(de.GetVf()); err == nil {
			p, _ := podOf(de)
			if err := s.h.do(func() error { return vf.DetachPod(vf.VF{Kind: vf.KindSRIOV}, name, p) }); err != nil {
				return nil, status.Error(codes.Internal, err.Error())
			}
		}
	}
	return s.h.dpu.DeleteEndpoint(ctx, req)
}

func (s *hostAPI) CheckEndpoint(ctx context.Context, req *apiv1.CheckEndpointRequest) (*apiv1.CheckEndpointResponse, error) {
	if req.GetKind() == apiv1.EndpointKind_ENDPOINT_KIND_VM {
		return nil, status.Error(codes.Unimplemented, "VM attachments on a DPU node are not supported yet")
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	de, err := s.h.dpu.CheckEndpoint(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := checkPodSide(de); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &apiv1.CheckEndpointResponse{Endpoint: de.GetEndpoint()}, nil
}

func (s *hostAPI) ListEndpoints(ctx context.Context, req *apiv1.ListEndpointsRequest) (*apiv1.ListEndpointsResponse, error) {
	list, err := s.h.dpu.ListEndpoints(ctx, req)
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListEndpointsResponse{}
	for _, de := range list.GetEndpoints() {
		out.Endpoints = append(out.Endpoints, de.GetEndpoint())
	}
	return out, nil
}

func (s *hostAPI) GC(ctx context.Context, req *apiv1.GCRequest) (*apiv1.GCResponse, error) {
	s.h.opMu.Lock()
	defer s.h.opMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	return s.h.dpu.GC(ctx, req)
}

// Status is the DPU's status with the datapath's location and the link's
// state; not ready while the DPU is unreachable.
func (s *hostAPI) Status(ctx context.Context, req *apiv1.StatusRequest) (*apiv1.StatusResponse, error) {
	p := s.h.Peer()
	where := fmt.Sprintf("DPU agent at %s", s.h.cfg.DPUAddr)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := s.h.api.Status(ctx, req)
	if err != nil {
		return &apiv1.StatusResponse{
			Version:  s.h.cfg.Version,
			Datapath: &apiv1.DatapathStatus{Backend: "dpu", Location: where + ": unreachable", Error: err.Error()},
			Ready:    false, Reason: "DPU agent unreachable: " + err.Error(),
			DpuLink: s.h.LinkStatus(),
		}, nil
	}
	node := ""
	if p.Hello != nil {
		node = p.Hello.GetNode()
	}
	dp := st.GetDatapath()
	if dp == nil {
		dp = &apiv1.DatapathStatus{}
	}
	dp.Location = fmt.Sprintf("%s (node %s, datapath %s there): connected, %d reconnects, up since %s", where, node,
		dp.GetBackend(), p.Reconnects, p.Since.UTC().Format(time.RFC3339))
	if p.ReconcileErr != "" {
		dp.Location += "; reconcile failed, retrying: " + p.ReconcileErr
	}
	dp.Backend = "dpu"
	st.Datapath = dp
	st.Version = s.h.cfg.Version
	st.Kernel = nil // the DPU's kernel: `lanekit status` there shows it
	st.DpuLink = s.h.LinkStatus()
	return st, nil
}

// The control plane lives on the DPU: forwarded as is.

func (s *hostAPI) ApplyObjects(ctx context.Context, req *apiv1.ApplyObjectsRequest) (*apiv1.ApplyObjectsResponse, error) {
	return s.h.api.ApplyObjects(ctx, req)
}

func (s *hostAPI) DeleteObject(ctx context.Context, req *apiv1.DeleteObjectRequest) (*apiv1.DeleteObjectResponse, error) {
	return s.h.api.DeleteObject(ctx, req)
}

func (s *hostAPI) ListServices(ctx context.Context, req *apiv1.ListServicesRequest) (*apiv1.ListServicesResponse, error) {
	return s.h.api.ListServices(ctx, req)
}

func (s *hostAPI) ListPolicies(ctx context.Context, req *apiv1.ListPoliciesRequest) (*apiv1.ListPoliciesResponse, error) {
	return s.h.api.ListPolicies(ctx, req)
}

// AddVM places a VM's fast lane on the DPU (CreateVM): the VM's QEMU runs
// here in req's namespace, everything of the endpoint there; nothing of it
// is created on the host.
func (s *hostAPI) AddVM(ctx context.Context, req *apiv1.AddVMRequest) (*apiv1.AddVMResponse, error) {
	if err := checkNetnsFile(req.GetNetns()); err != nil {
		return nil, err
	}
	s.h.opMu.Lock()
	defer s.h.opMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	dv, err := s.h.dpu.CreateVM(ctx, req)
	if err != nil {
		return nil, err
	}
	s.h.log.Info("vm on the DPU", "vm", req.GetName(), "netns", req.GetNetns(), "dpu_device_netns", dv.GetDeviceNetns(),
		"socket", dv.GetVm().GetSocket())
	return &apiv1.AddVMResponse{Vm: dv.GetVm()}, nil
}

func (s *hostAPI) DelVM(ctx context.Context, req *apiv1.DelVMRequest) (*apiv1.DelVMResponse, error) {
	s.h.opMu.Lock()
	defer s.h.opMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	return s.h.dpu.DeleteVM(ctx, req)
}

func (s *hostAPI) ListVMs(ctx context.Context, req *apiv1.ListVMsRequest) (*apiv1.ListVMsResponse, error) {
	return s.h.api.ListVMs(ctx, req)
}

// VMMigrationChanged: live migration to or from a DPU node is not built
// (CreateVM refuses an incoming VM); said clearly rather than as a missing
// method.
func (s *hostAPI) VMMigrationChanged(context.Context, *apiv1.VMMigrationChangedRequest) (*apiv1.VMMigrationChangedResponse, error) {
	return nil, status.Error(codes.Unimplemented, "live migration of a VM on a DPU node is not supported")
}

// checkNetnsFile refuses a netns path that is no file (FailedPrecondition).
func checkNetnsFile(p string) error {
	if fi, err := os.Stat(p); err != nil || fi.IsDir() {
		return status.Errorf(codes.FailedPrecondition, "netns %q: not a network namespace file (%v)", p, err)
	}
	return nil
}
