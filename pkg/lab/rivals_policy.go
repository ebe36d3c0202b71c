package lab

// lab bench --cni --policies: the cross-node pod row of each network's
// real-node lab with N NetworkPolicies selecting the bench pods, written
// through the API server, for the networks that enforce NetworkPolicy
// (lanekit, Cilium; flannel enforces none). A row is measured only once its
// network enforces its set: before the policy that allows the client, the
// server must be unreachable from it; after, reachable.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lanekit/lanekit/internal/workpool"
	"github.com/lanekit/lanekit/pkg/bench"
)

// enforcesPolicy reports whether cni's lab enforces NetworkPolicy.
func enforcesPolicy(cni, routing string) bool {
	r, rival, _ := rivalFor(cni, routing)
	return !rival || r.Cilium
}

// policyProbeName is the extra policy that isolates the server while a set
// is written (it allows nothing the bench sends).
const policyProbeName = "bench-pol-probe"

// rivalPolicies keeps a real-node lab's bench policies at a count.
type rivalPolicies struct {
	kc       kubernetes.Interface
	clientNS string // the bench client's netns (benchPods[0])
	serverIP string // the cross-node server's pod IP
	timeout  time.Duration
	mu       sync.Mutex
	current  int // -1: unknown
}

// policyRows returns paths with each count's cross-node row added (and a
// Prepare on every other row that removes the policies), or why not.
func (p *rivalPolicies) policyRows(cni string, counts []int, only bool, paths []bench.Path) []bench.Path {
	var out []bench.Path
	var cross *bench.Path
	for _, path := range paths {
		if path.Name == BenchPodCrossNode {
			c := path
			cross = &c
		}
		if only {
			continue
		}
		path.Prepare = func(ctx context.Context) error { return p.ensure(ctx, 0) }
		out = append(out, path)
	}
	if cross == nil {
		return out
	}
	for _, n := range counts {
		row := *cross
		row.Name = fmt.Sprintf("%s+%d-policies", BenchPodCrossNode, n)
		row.Policies, row.PolicyBase = &n, BenchPodCrossNode
		row.Note = fmt.Sprintf("%s; %d NetworkPolicies selecting the pods (API-written, enforced before measuring)", row.Note, n)
		row.Prepare = func(ctx context.Context) error { return p.ensure(ctx, n) }
		out = append(out, row)
	}
	return out
}

// ensure makes the lab hold exactly bench policies 0..n-1 and waits until
// the network enforces them.
func (p *rivalPolicies) ensure(ctx context.Context, n int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.current == n {
		return nil
	}
	p.current = -1
	pc := p.kc.NetworkingV1().NetworkPolicies(bench.PolicyNamespace)
	list, err := pc.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var old []string
	for _, np := range list.Items {
		if strings.HasPrefix(np.Name, "bench-pol-") {
			old = append(old, np.Name)
		}
	}
	del := func(ctx context.Context, name string) error {
		if err := pc.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete policy %s: %w", name, err)
		}
		return nil
	}
	if err := workpool.Run(ctx, len(old), 16, func(ctx context.Context, i int) error { return del(ctx, old[i]) }); err != nil {
		return err
	}
	if n == 0 {
		if err := p.waitReach(ctx, true); err != nil {
			return fmt.Errorf("no policies: %w", err)
		}
		p.current = 0
		return nil
	}
	set, err := bench.PolicySet(n, networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: benchPodLabels}})
	if err != nil {
		return err
	}
	probe, _ := bench.PolicySet(2, networkingv1.NetworkPolicyPeer{})
	probe[1].Name = policyProbeName
	create := func(ctx context.Context, np *networkingv1.NetworkPolicy) error {
		if _, err := pc.Create(ctx, np, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create policy %s: %w", np.Name, err)
		}
		return nil
	}
	// The probe and the decoys first: the server is isolated from the client.
	decoys := append([]*networkingv1.NetworkPolicy{probe[1]}, set[1:]...)
	if err := workpool.Run(ctx, len(decoys), 16, func(ctx context.Context, i int) error { return create(ctx, decoys[i]) }); err != nil {
		return err
	}
	if err := p.waitReach(ctx, false); err != nil {
		return fmt.Errorf("%d policies without the client's: %w", n-1, err)
	}
	if err := create(ctx, set[0]); err != nil {
		return err
	}
	if err := p.waitReach(ctx, true); err != nil {
		return fmt.Errorf("%d policies with the client's: %w", n, err)
	}
	if err := del(ctx, policyProbeName); err != nil {
		return err
	}
	p.current = n
	return nil
}

// errUnreachable: the probe's SYN got no answer.
var errUnreachable = errors.New("no answer")

// probe dials the server's discard port from the client's netns: a refusal
// is the server's kernel answering (nothing listens there), a timeout a
// network that dropped the SYN.
func (p *rivalPolicies) probe() error {
	return ns.WithNetNSPath(netnsPath(p.clientNS), func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(p.serverIP, "9"), 500*time.Millisecond)
		switch {
		case err == nil:
			c.Close()
			return nil
		case errors.Is(err, syscall.ECONNREFUSED):
			return nil
		case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
			return fmt.Errorf("%w: %v", errUnreachable, err)
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return errUnreachable
		}
		return err
	})
}

// waitReach polls the probe until the server is (un)reachable from the
// client, up to p.timeout.
func (p *rivalPolicies) waitReach(ctx context.Context, reach bool) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	for {
		err := p.probe()
		if err != nil && !errors.Is(err, errUnreachable) {
			return err
		}
		if (err == nil) == reach {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the bench server %s still %s from the client after %v", p.serverIP,
				map[bool]string{true: "unreachable", false: "reachable"}[reach], p.timeout)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
