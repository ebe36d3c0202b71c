package dpu

import (
	"context"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	apiv1 "github.com/lanekit/lanekit/api/v1"
)

// hostCalls are the RPCs a host agent may make on the DPU link: what
// hostAPI needs, nothing else. Every other method, of the services
// registered on the link now or later, is refused (PermissionDenied):
//   - Agent AddEndpoint, DelEndpoint, CheckEndpoint, ListEndpoints, GC: the
//     DPU service's Create/Delete/Check/ListEndpoints and GC do these with
//     the VF that pairs the endpoint with the host (and refuse VM kinds);
//     called raw they would skip that.
//   - Agent AddVM, DelVM: AddVM enters the network namespace path the
//     caller names, on the DPU; the DPU service's CreateVM picks it there
//     (VMNetns) and refuses incoming migrations.
//   - Agent VMMigrationChanged, SyncEndpointRoutes: migration state and
//     claims install /32 routes for any address on the DPU: a host could
//     pull another node's pod traffic to itself. Migration to or from a DPU
//     node is not supported.
//
// ApplyObjects and DeleteObject (Services, policy, Pods) are allowed only
// when the DPU agent has no Kubernetes source (Server.HostObjects): then the
// host's `lanekit service|policy apply` is how the node is configured; with
// the API server as the source, a host that could write policy for the
// pods the DPU isolates would defeat the DPU.
var hostCalls = []string{
	apiv1.DPU_Hello_FullMethodName,
	apiv1.DPU_CreateEndpoint_FullMethodName,
	apiv1.DPU_DeleteEndpoint_FullMethodName,
	apiv1.DPU_CheckEndpoint_FullMethodName,
	apiv1.DPU_ListEndpoints_FullMethodName,
	apiv1.DPU_GC_FullMethodName,
	apiv1.DPU_CreateVM_FullMethodName,
	apiv1.DPU_DeleteVM_FullMethodName,
	apiv1.Agent_Status_FullMethodName,
	apiv1.Agent_ListServices_FullMethodName,
	apiv1.Agent_ListPolicies_FullMethodName,
	apiv1.Agent_ListVMs_FullMethodName,
}

// hostObjectCalls are allowed with Server.HostObjects.
var hostObjectCalls = []string{apiv1.Agent_ApplyObjects_FullMethodName, apiv1.Agent_DeleteObject_FullMethodName}

// CertNames says whether x names id: a DNS or URI SAN equal to it, or the
// subject's common name.
func CertNames(x *x509.Certificate, id string) bool {
	if id == "" {
		return false
	}
	if slices.Contains(x.DNSNames, id) || x.Subject.CommonName == id {
		return true
	}
	for _, u := range x.URIs {
		if u.String() == id {
			return true
		}
	}
	return false
}

// certIdentity describes the names x carries, for a refusal.
func certIdentity(x *x509.Certificate) string {
	names := append([]string{"CN=" + x.Subject.CommonName}, x.DNSNames...)
	for _, u := range x.URIs {
		names = append(names, u.String())
	}
	return strings.Join(names, ", ")
}

// authorize decides one call: the caller's certificate must name the host
// this DPU serves and be within its validity now (a connection outlives
// the handshake), and the method must be one a host may call.
func (s *Server) authorize(ctx context.Context, method string) error {
	err := s.check(ctx, method)
	if err != nil {
		s.mu.Lock()
		s.refused++
		s.lastRefusal = err.Error()
		s.mu.Unlock()
		s.logger().Warn("DPU link call refused", "method", method, "err", err)
		return status.Error(codes.PermissionDenied, err.Error())
	}
	return nil
}

func (s *Server) check(ctx context.Context, method string) error {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return fmt.Errorf("%s: no peer", method)
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return fmt.Errorf("%s: no client certificate", method)
	}
	leaf := ti.State.PeerCertificates[0]
	if !CertNames(leaf, s.HostIdentity) {
		return fmt.Errorf("%s: this DPU serves host %q; the certificate names %s", method, s.HostIdentity, certIdentity(leaf))
	}
	if now := time.Now(); now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		return fmt.Errorf("%s: the host's certificate is valid %s to %s, not now", method,
			leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if slices.Contains(hostObjectCalls, method) && !s.HostObjects {
		return fmt.Errorf("%s is not for the host agent to call on the DPU link: this DPU takes Services and policy from the Kubernetes API server", method)
	}
	if !slices.Contains(hostCalls, method) && !slices.Contains(hostObjectCalls, method) {
		return fmt.Errorf("%s is not for the host agent to call on the DPU link", method)
	}
	if s.Creds != nil {
		s.Creds.setPeer(leaf)
	}
	return nil
}

func (s *Server) unaryAuth(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := s.authorize(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (s *Server) streamAuth(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := s.authorize(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return h(srv, ss)
}

// LinkStatus is the DPU side of the link for `lanekit status` and the
// metrics.
func (s *Server) LinkStatus() *apiv1.DPULinkStatus {
	s.mu.Lock()
	st := &apiv1.DPULinkStatus{Role: "dpu", PeerIdentity: s.HostIdentity, RefusedCalls: s.refused, LastRefusal: s.lastRefusal}
	s.mu.Unlock()
	if s.Creds != nil {
		st.Certificates = s.Creds.Certificates()
		if err := s.Creds.ReloadError(); err != nil {
			st.ReloadError = err.Error()
		}
	}
	return st
}

// StatusInterceptor adds the link's status to the DPU agent's Status
// answers (its own socket: `lanekit status` on the DPU).
func (s *Server) StatusInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	if st, ok := resp.(*apiv1.StatusResponse); ok && err == nil && info.FullMethod == apiv1.Agent_Status_FullMethodName {
		st.DpuLink = s.LinkStatus()
	}
	return resp, err
}
