package lab

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/bench"
)

// IncludesPolicyPod labels the policy rows.
var IncludesPolicyPod = bench.Includes{BPF: true,
	Detail: "lanekit pod to pod across nodes with N NetworkPolicies selecting the pods (ingress, every agent): policy lookups in from_pod/ingress"}

// PolicyRows adds to others the lanekit-pod row measured with each count of
// NetworkPolicies selecting the pods (node 1's first lanekit pod to node 2's).
// Every row's Prepare makes both agents hold exactly its policies, and the
// rows of others get one that removes them, so all rows interleave as usual
// and only the policy rows see policies.
func (s *State) PolicyRows(counts []int, others []bench.Path) ([]bench.Path, []string, func()) {
	if s.BaselineOnly || len(s.Nodes) < 2 {
		return others, []string{"policy rows: need a lanekit lab with 2 nodes"}, func() {}
	}
	n1, n2 := s.Nodes[0], s.Nodes[1]
	c, okc := firstPod(n1, KindLanekit)
	sv, oks := firstPod(n2, KindLanekit)
	if !okc || !oks {
		return others, []string{fmt.Sprintf("policy rows: no lanekit pods on %s and %s", n1.NS, n2.NS)}, func() {}
	}
	ps := &policyState{sockets: []string{AgentSocket(n1.Index), AgentSocket(n2.Index)}, current: -1,
		allow: netip.MustParsePrefix(n1.PodCIDR)}
	var paths []bench.Path
	for _, p := range others {
		if p.Prepare == nil {
			p.Prepare = func(ctx context.Context) error { return ps.ensure(ctx, 0) }
		}
		paths = append(paths, p)
	}
	for _, n := range counts {
		n := n
		paths = append(paths, bench.Path{Name: fmt.Sprintf("lanekit-pod+%d-policies", n), ClientNS: c.NS, ServerNS: sv.NS,
			ServerIP: sv.IP, Includes: IncludesPolicyPod, Policies: &n, PolicyBase: "lanekit-pod",
			Prepare: func(ctx context.Context) error { return ps.ensure(ctx, n) }})
	}
	return paths, nil, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		ps.close(ctx)
	}
}

// policyState tracks how many bench policies the agents hold.
type policyState struct {
	sockets []string
	allow   netip.Prefix
	mu      sync.Mutex
	conns   []*grpc.ClientConn
	current int // -1: unknown
}

func (p *policyState) clients() ([]apiv1.AgentClient, error) {
	if p.conns == nil {
		for _, s := range p.sockets {
			conn, err := grpc.NewClient("unix://"+s, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return nil, fmt.Errorf("agent at %s: %w", s, err)
			}
			p.conns = append(p.conns, conn)
		}
	}
	var out []apiv1.AgentClient
	for _, c := range p.conns {
		out = append(out, apiv1.NewAgentClient(c))
	}
	return out, nil
}

// ensure makes every agent hold exactly policies 0..n-1 of the bench set.
func (p *policyState) ensure(ctx context.Context, n int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.current == n {
		return nil
	}
	cs, err := p.clients()
	if err != nil {
		return err
	}
	data, err := bench.PolicySetJSON(n, p.allow)
	if err != nil {
		return err
	}
	p.current = -1
	for _, c := range cs {
		if err := deleteBenchPolicies(ctx, c, n); err != nil {
			return err
		}
		if n > 0 {
			if _, err := c.ApplyObjects(ctx, &apiv1.ApplyObjectsRequest{Data: data}); err != nil {
				return fmt.Errorf("apply %d policies: %w", n, err)
			}
		}
	}
	p.current = n
	return nil
}

// deleteBenchPolicies removes bench policies with index >= keep.
func deleteBenchPolicies(ctx context.Context, c apiv1.AgentClient, keep int) error {
	list, err := c.ListPolicies(ctx, &apiv1.ListPoliciesRequest{})
	if err != nil {
		return fmt.Errorf("list policies: %w", err)
	}
	for _, pol := range list.GetPolicies() {
		var i int
		if pol.GetNamespace() != bench.PolicyNamespace {
			continue
		}
		if _, err := fmt.Sscanf(pol.GetName(), "bench-pol-%d", &i); err != nil || i < keep {
			continue
		}
		if _, err := c.DeleteObject(ctx, &apiv1.DeleteObjectRequest{Object: &apiv1.ObjectRef{
			Kind: "NetworkPolicy", Namespace: pol.GetNamespace(), Name: pol.GetName()}}); err != nil {
			return fmt.Errorf("delete policy %s: %w", pol.GetName(), err)
		}
	}
	return nil
}

// close removes the bench policies from every agent (best effort).
func (p *policyState) close(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cs, err := p.clients(); err == nil {
		for _, c := range cs {
			_ = deleteBenchPolicies(ctx, c, 0)
		}
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}
