package agent

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/endpoint"
)

// parseVMAddress takes "10.244.2.5" or "10.244.2.5/32" (IPv6: "fd00::5" or "fd00::5/128").
func parseVMAddress(s string) (netip.Addr, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		if p.Bits() != p.Addr().BitLen() {
			return netip.Addr{}, fmt.Errorf("vm address %s: want one address: %w", s, ErrInvalid)
		}
		return p.Addr(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("vm address %q: %w: %w", s, err, ErrInvalid)
	}
	return a, nil
}

func migrationToProto(out *apiv1.VM, m *endpoint.VMMigration) {
	if m == nil {
		return
	}
	out.MigrationState, out.Generation, out.ActivatedBy = string(m.State), m.Generation, m.ActivatedBy
	if !m.Activated.IsZero() {
		out.ActivatedUnixNano = m.Activated.UnixNano()
	}
}

func (s *server) VMMigrationChanged(_ context.Context, req *apiv1.VMMigrationChangedRequest) (*apiv1.VMMigrationChangedResponse, error) {
	v, err := s.a.VMMigrationEvent(req.GetName(), strings.ToLower(req.GetRole()), strings.ToLower(req.GetPhase()))
	if err != nil {
		return nil, statusErr(err)
	}
	resp := &apiv1.VMMigrationChangedResponse{}
	if v != nil {
		resp.Vm = VMToProto(v)
	}
	return resp, nil
}

func (s *server) SyncEndpointRoutes(_ context.Context, req *apiv1.SyncEndpointRoutesRequest) (*apiv1.SyncEndpointRoutesResponse, error) {
	routes := make([]EndpointRoute, 0, len(req.GetRoutes()))
	for _, r := range req.GetRoutes() {
		addr, err := parseVMAddress(r.GetAddress())
		if err != nil {
			return nil, statusErr(err)
		}
		via, err := netip.ParseAddr(r.GetVia())
		if err != nil {
			return nil, statusErr(fmt.Errorf("endpoint route %s: via %q: %w: %w", addr, r.GetVia(), err, ErrInvalid))
		}
		routes = append(routes, EndpointRoute{Addr: addr, Via: via, Generation: r.GetGeneration(), VM: r.GetVm(), Node: r.GetNode()})
	}
	n, superseded, err := s.a.SyncEndpointRoutes(routes)
	if err != nil {
		return nil, statusErr(err)
	}
	return &apiv1.SyncEndpointRoutesResponse{Routes: uint32(n), Superseded: superseded}, nil
}
