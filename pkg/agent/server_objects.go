package agent

import (
	"context"
	"time"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/service"
)

func (s *server) ApplyObjects(_ context.Context, req *apiv1.ApplyObjectsRequest) (*apiv1.ApplyObjectsResponse, error) {
	objs, err := s.a.ApplyObjects(req.GetData())
	if err != nil {
		return nil, statusErr(err)
	}
	resp := &apiv1.ApplyObjectsResponse{}
	for _, o := range objs {
		resp.Applied = append(resp.Applied, &apiv1.ObjectRef{Kind: string(o.Kind), Namespace: o.Namespace(), Name: o.Name()})
	}
	return resp, nil
}

func (s *server) DeleteObject(_ context.Context, req *apiv1.DeleteObjectRequest) (*apiv1.DeleteObjectResponse, error) {
	ref := req.GetObject()
	kind, err := k8sobj.ParseKind(ref.GetKind())
	if err != nil {
		return nil, statusErr(wrapInvalid(err))
	}
	existed := s.a.hasObject(kind, ref.GetNamespace(), ref.GetName())
	if err := s.a.DeleteObject(kind, ref.GetNamespace(), ref.GetName()); err != nil {
		return nil, statusErr(err)
	}
	return &apiv1.DeleteObjectResponse{Existed: existed}, nil
}

func scopeName(sc service.Scope) string {
	if sc == service.ScopeNodePort {
		return "NodePort"
	}
	return "ClusterIP"
}

func (s *server) ListServices(context.Context, *apiv1.ListServicesRequest) (*apiv1.ListServicesResponse, error) {
	resp := &apiv1.ListServicesResponse{}
	for _, f := range s.a.Frontends() {
		pf := &apiv1.ServiceFrontend{
			Namespace: f.Service.Namespace, Name: f.Service.Name, PortName: f.PortName,
			Address: f.Key.Addr.String(), Port: uint32(f.Key.Port), Protocol: f.Key.Proto.String(), Scope: scopeName(f.Key.Scope),
			FrontendId: f.FrontendID, MaglevSize: uint32(f.MaglevSize), EligibleBackends: uint32(f.Eligible),
			AffinityTimeoutSeconds: uint32(f.AffinityTimeout / time.Second), Local: f.Local, External: f.External,
		}
		for _, b := range f.Backends {
			pf.Backends = append(pf.Backends, &apiv1.ServiceBackend{Address: b.Addr.Addr().String(), Port: uint32(b.Addr.Port()), State: b.State.String()})
		}
		resp.Frontends = append(resp.Frontends, pf)
	}
	return resp, nil
}

func (s *server) ListPolicies(context.Context, *apiv1.ListPoliciesRequest) (*apiv1.ListPoliciesResponse, error) {
	pols, err := s.a.Policies()
	if err != nil {
		return nil, statusErr(err)
	}
	resp := &apiv1.ListPoliciesResponse{}
	for _, p := range pols {
		resp.Policies = append(resp.Policies, &apiv1.NetworkPolicy{Namespace: p.Namespace, Name: p.Name, Ingress: p.Ingress, Egress: p.Egress,
			AllowedPackets: p.Verdict.Allowed, DeniedPackets: p.Verdict.Denied, NotProgrammed: p.NotProgrammed})
	}
	return resp, nil
}

// ControlPlaneToProto converts the control plane's stats.
func ControlPlaneToProto(st ControlStats) *apiv1.ControlPlaneStatus {
	pc := &apiv1.ControlPlaneStatus{Objects: map[string]uint32{}, Services: uint32(st.Services), Frontends: uint32(st.Frontends),
		Backends: uint32(st.Backends), Policies: uint32(st.Policies), Identities: uint32(st.Identities), PolicyRules: uint32(st.Rules),
		ServiceDatapath: st.ServiceDP, PolicyDatapath: st.PolicyDP, PendingUpdates: uint32(st.PendingSvc + st.PendingPol),
		ConntrackGcRuns: st.GCRuns, ConntrackGcRemoved: st.GCRemoved, Error: st.ConntrackErr}
	if st.GCLastError != "" {
		pc.Error = "conntrack gc: " + st.GCLastError
	}
	for k, n := range st.Objects {
		pc.Objects[string(k)] = uint32(n)
	}
	if st.SockLB.State != "" {
		pc.SocketLb = &apiv1.SocketLBStatus{State: st.SockLB.State, Cgroup: st.SockLB.Cgroup}
		if st.SockLB.NodeAddr.IsValid() {
			pc.SocketLb.NodeAddr = st.SockLB.NodeAddr.String()
		}
	}
	for _, h := range st.HealthChecks {
		pc.HealthChecks = append(pc.HealthChecks, &apiv1.HealthCheckStatus{Namespace: h.Service.Namespace, Name: h.Service.Name,
			Port: uint32(h.Port), LocalEndpoints: uint32(h.LocalEndpoints), Error: h.Err})
	}
	for _, m := range st.Maps {
		pc.Maps = append(pc.Maps, &apiv1.MapFill{Name: m.Map, Entries: uint32(m.Entries), Capacity: uint32(m.Capacity),
			UnprogrammedFrontends: uint32(m.UnprogrammedFrontends), UnprogrammedServices: uint32(m.UnprogrammedServices),
			UnprogrammedPolicies: uint32(m.UnprogrammedPolicies), UnprogrammedEntries: uint32(m.UnprogrammedEntries)})
	}
	if ct := st.Conntrack; ct != nil {
		pc.ConntrackEntries, pc.ConntrackCapacity, pc.ConntrackFull, pc.LbCounters = uint32(ct.ConntrackEntries), uint32(ct.ConntrackCapacity), ct.ConntrackEvicted, LBCounters(*ct)
	}
	return pc
}

// EndpointPolicyToProto converts an endpoint's policy view.
func EndpointPolicyToProto(p EndpointPolicyInfo) *apiv1.EndpointPolicy {
	return &apiv1.EndpointPolicy{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels, Identity: p.Identity, FromPod: p.FromPod,
		EgressBps: p.EgressBPS, BandwidthNote: p.BandwidthNote}
}
