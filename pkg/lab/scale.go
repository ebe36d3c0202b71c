package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/lanekit/lanekit/internal/workpool"
)

// The scale lab: the two real agents of a `lab up --k8s` lab, driven only
// through the lab's API server, as a cluster's control plane drives them.
// `lanekit lab scale` adds Node objects without kubelets (pod CIDRs, an
// InternalIP on the underlay: the agents route to every one), Services
// with EndpointSlices as the endpointslice controller writes them
// (addresses in the fake nodes' pod CIDRs, the trigger-time annotation),
// pods with label sets giving distinct identities, NetworkPolicies; then
// churns endpoints at a fixed rate and measures (scalereport.go).

// ScaleConfig is what `lanekit lab scale` creates and how it churns.
type ScaleConfig struct {
	Nodes      int     // fake Node objects
	Services   int     // Services, one port each
	Endpoints  int     // endpoints per Service
	Pods       int     // pods on the fake nodes
	Identities int     // distinct label sets among the pods
	Policies   int     // NetworkPolicies
	ChurnRate  float64 // endpoint changes per second
	ChurnFor   time.Duration
	// QPS and Burst of the client that creates the objects.
	QPS   float32
	Burst int
	// Workers create objects in parallel.
	Workers int
	// Store, when set, stores FillScale's objects a kind at a time instead
	// of one create (and status update) each through the client: a test
	// API server's bulk load (k8stest.Server.Store; its creates pay the
	// API server's O(N) ClusterIP bookkeeping each).
	Store func(ctx context.Context, objs []runtime.Object) error
	// FillEtcd: RunScale fills with the lab API server's bulk load (Store
	// set to its k8stest.Server.Store): the objects are written to its etcd
	// as the API server stores them. The agents still learn of them, and of
	// the churn, through the API server's watches; only the fill skips its
	// creates (30,000 Services took 29 min through them).
	FillEtcd bool
	// FirstPacketAt: Service counts (ascending, at most Services) at which
	// the fill pauses, once both agents programmed that many, to time new
	// connections from a lab pod on node 1 through a probe Service to the
	// lab pods on node 2 (scaleprobe.go): FirstPacketRepeat runs of
	// FirstPacketFor each.
	FirstPacketAt     []int
	FirstPacketFor    time.Duration
	FirstPacketRepeat int
	// Self is the lanekit executable (its hidden cps client and server run
	// the probe); default: this process's.
	Self string
	Out  io.Writer // progress lines
}

// DefaultScaleConfig fits this lab's 2-core machine in a few minutes.
func DefaultScaleConfig() ScaleConfig {
	return ScaleConfig{Nodes: 100, Services: 5000, Endpoints: 4, Pods: 2000, Identities: 200, Policies: 100,
		ChurnRate: 20, ChurnFor: 30 * time.Second, QPS: 2000, Burst: 4000, Workers: 16,
		FirstPacketFor: 3 * time.Second, FirstPacketRepeat: 3}
}

// Scale objects carry this label (and live in ScaleNamespace) so that a
// run cleans up what an earlier one left.
const (
	ScaleLabel     = "lanekit.io/scale"
	ScaleNamespace = "default"
	scaleNodeFirst = 10  // fake node k's InternalIP: 10.77.0.(10+k)
	maxScaleNodes  = 200 // below the lab's service nodes (svcNodeFirstIP)
)

// ScaleNodeName, ScaleNodeCIDR and ScaleNodeIP are fake node k's.
func ScaleNodeName(k int) string { return fmt.Sprintf("lk-scale-node%d", k) }
func ScaleNodeCIDR(k int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(128 + k/256), byte(k % 256), 0}), 24)
}
func ScaleNodeIP(k int) string { return fmt.Sprintf("10.77.0.%d", scaleNodeFirst+k) }

func (c ScaleConfig) validate() error {
	switch {
	case c.Nodes < 1 || c.Nodes > maxScaleNodes:
		return fmt.Errorf("lab scale: --nodes %d: want 1-%d (InternalIPs on the lab's /24 underlay)", c.Nodes, maxScaleNodes)
	case c.Services < 1:
		return fmt.Errorf("lab scale: --services %d: want at least 1", c.Services)
	case c.Endpoints < 1 || c.Endpoints > 250:
		return fmt.Errorf("lab scale: --endpoints %d: want 1-250", c.Endpoints)
	case c.Pods < 0 || c.Pods > c.Nodes*250:
		return fmt.Errorf("lab scale: --pods %d: want 0-%d (250 per fake node)", c.Pods, c.Nodes*250)
	case c.Identities < 1 || c.Policies < 0 || c.ChurnRate < 0 || c.Workers < 1:
		return errors.New("lab scale: --identities and --workers must be >= 1, --policies and --churn-rate >= 0")
	}
	for k, n := range c.FirstPacketAt {
		if n < 1 || n > c.Services || (k > 0 && n <= c.FirstPacketAt[k-1]) {
			return fmt.Errorf("lab scale: --first-packet-at %v: want ascending counts from 1 to --services %d", c.FirstPacketAt, c.Services)
		}
	}
	if len(c.FirstPacketAt) > 0 && (c.FirstPacketFor < time.Second || c.FirstPacketRepeat < 1) {
		return fmt.Errorf("lab scale: --first-packet-for %v (want >= 1s) and --first-packet-repeat %d (want >= 1)", c.FirstPacketFor, c.FirstPacketRepeat)
	}
	return nil
}

// scaleAddr is the j-th address of fake node k's pod CIDR (1-based, < 255).
func scaleAddr(k, j int) string {
	a := ScaleNodeCIDR(k).Addr().As4()
	a[3] = byte(j)
	return netip.AddrFrom4(a).String()
}

var scaleLabels = map[string]string{ScaleLabel: "1"}

// FillScale creates what `lanekit lab scale` creates before it churns —
// cfg.Nodes Nodes, cfg.Services Services with their EndpointSlices, pods and
// policies — through c on any API server (lanekitd's memory harness fills a
// test API server with it, no lab needed), or with cfg.Store.
func FillScale(ctx context.Context, c kubernetes.Interface, cfg ScaleConfig) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	if err := createNodes(ctx, c, cfg); err != nil {
		return fmt.Errorf("nodes: %w", err)
	}
	if err := createServices(ctx, c, cfg, 0, cfg.Services); err != nil {
		return fmt.Errorf("services: %w", err)
	}
	if err := createPods(ctx, c, cfg); err != nil {
		return fmt.Errorf("pods and policies: %w", err)
	}
	return nil
}

// scaleNodeObjects, scaleServiceObjects and scalePodObjects are FillScale's
// objects of each step, for cfg.Store.
func scaleNodeObjects(cfg ScaleConfig) []runtime.Object {
	var out []runtime.Object
	for k := range cfg.Nodes {
		out = append(out, scaleNode(k))
	}
	return out
}

func scaleServiceObjects(cfg ScaleConfig, from, to int) []runtime.Object {
	var out []runtime.Object
	now := time.Now()
	for i := from; i < to; i++ {
		out = append(out, scaleService(i), scaleSlice(cfg, i, 0, now))
	}
	return out
}

func scalePodObjects(cfg ScaleConfig) []runtime.Object {
	var out []runtime.Object
	for p := range cfg.Pods {
		out = append(out, scalePod(cfg, p))
	}
	for q := range cfg.Policies {
		out = append(out, scalePolicy(cfg, q))
	}
	return out
}

// scaleNode is fake node k, Ready, with its pod CIDR and InternalIP.
func scaleNode(k int) *corev1.Node {
	cidr := ScaleNodeCIDR(k).String()
	now := metav1.Now()
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: ScaleNodeName(k), Labels: scaleLabels},
		Spec: corev1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ScaleNodeIP(k)}},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: now, LastTransitionTime: now, Reason: "LabScale"}}}}
}

// createNodes registers the fake Nodes, then sets their status.
func createNodes(ctx context.Context, c kubernetes.Interface, cfg ScaleConfig) error {
	if cfg.Store != nil {
		return cfg.Store(ctx, scaleNodeObjects(cfg))
	}
	return workpool.Run(ctx, cfg.Nodes, cfg.Workers, func(ctx context.Context, k int) error {
		want := scaleNode(k)
		n, err := c.CoreV1().Nodes().Create(ctx, want, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("node %s: %w", want.Name, err)
		}
		n.Status = want.Status
		_, err = c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

// scaleService is Service i: one TCP port, a selector of its own.
func scaleService(i int) *corev1.Service {
	name := fmt.Sprintf("scale-%d", i)
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ScaleNamespace, Labels: scaleLabels},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
			Selector: map[string]string{"scale-svc": name}}}
}

// scaleSlice is Service i's EndpointSlice with its endpoints spread over
// the fake nodes; gen varies the last endpoint's address (churn).
func scaleSlice(cfg ScaleConfig, i, gen int, trigger time.Time) *discoveryv1.EndpointSlice {
	name := fmt.Sprintf("scale-%d", i)
	port, pname := int32(8080), "http"
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-x", Namespace: ScaleNamespace,
			Labels:      map[string]string{ScaleLabel: "1", discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"},
			Annotations: map[string]string{corev1.EndpointsLastChangeTriggerTime: trigger.UTC().Format(time.RFC3339Nano)}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for e := range cfg.Endpoints {
		k := (i*cfg.Endpoints + e) % cfg.Nodes
		j := 1 + (i*cfg.Endpoints+e)/cfg.Nodes%200
		if e == cfg.Endpoints-1 {
			j = 1 + (j-1+gen*37)%250
		}
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{scaleAddr(k, j)}, NodeName: ptr.To(ScaleNodeName(k)),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}})
	}
	return s
}

// createServices creates Services from to to (exclusive) and their slices.
func createServices(ctx context.Context, c kubernetes.Interface, cfg ScaleConfig, from, to int) error {
	if cfg.Store != nil {
		return cfg.Store(ctx, scaleServiceObjects(cfg, from, to))
	}
	return workpool.Run(ctx, to-from, cfg.Workers, func(ctx context.Context, k int) error {
		i := from + k
		svc := scaleService(i)
		if _, err := c.CoreV1().Services(ScaleNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("service %s: %w", svc.Name, err)
		}
		_, err := c.DiscoveryV1().EndpointSlices(ScaleNamespace).Create(ctx, scaleSlice(cfg, i, 0, time.Now()), metav1.CreateOptions{})
		return err
	})
}

// scalePod is pod p on a fake node (no kubelet: its status is set as a
// kubelet would), with one of cfg.Identities label sets.
func scalePod(cfg ScaleConfig, p int) *corev1.Pod {
	k, j := p%cfg.Nodes, 1+p/cfg.Nodes
	ip := scaleAddr(k, j)
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("scale-pod-%d", p), Namespace: ScaleNamespace,
		Labels: map[string]string{ScaleLabel: "1", "app": fmt.Sprintf("a%d", p%cfg.Identities)}},
		Spec:   corev1.PodSpec{NodeName: ScaleNodeName(k), Containers: []corev1.Container{{Name: "c", Image: "none"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, HostIP: ScaleNodeIP(k)}}
}

// scalePolicy is policy q: pods of identity q admit identity q+1 on 8080.
func scalePolicy(cfg ScaleConfig, q int) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("scale-pol-%d", q), Namespace: ScaleNamespace, Labels: scaleLabels},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("a%d", q%cfg.Identities)}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"app": fmt.Sprintf("a%d", (q+1)%cfg.Identities)}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromInt32(8080))}}}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		}}
}

// createPods creates the pods, sets their status, then creates the
// policies selecting them.
func createPods(ctx context.Context, c kubernetes.Interface, cfg ScaleConfig) error {
	if cfg.Store != nil {
		return cfg.Store(ctx, scalePodObjects(cfg))
	}
	err := workpool.Run(ctx, cfg.Pods, cfg.Workers, func(ctx context.Context, p int) error {
		want := scalePod(cfg, p)
		out, err := c.CoreV1().Pods(ScaleNamespace).Create(ctx, want, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("pod %s: %w", want.Name, err)
		}
		out.Status = want.Status
		_, err = c.CoreV1().Pods(ScaleNamespace).UpdateStatus(ctx, out, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return err
	}
	return workpool.Run(ctx, cfg.Policies, cfg.Workers, func(ctx context.Context, q int) error {
		_, err := c.NetworkingV1().NetworkPolicies(ScaleNamespace).Create(ctx, scalePolicy(cfg, q), metav1.CreateOptions{})
		return err
	})
}

// churnEvent is one endpoint change: the Service, the new backend and when
// it was written.
type churnEvent struct {
	svc     int
	backend netip.Addr
	at      time.Time
}

// churn replaces the last endpoint of random Services at rate per second
// for d (every tenth change relabels a pod instead when there are pods),
// handing each endpoint change to probe (non-blocking).
func churn(ctx context.Context, c kubernetes.Interface, cfg ScaleConfig, probe chan<- churnEvent) (changes, relabels int, err error) {
	if cfg.ChurnRate <= 0 || cfg.ChurnFor <= 0 {
		return 0, 0, nil
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / cfg.ChurnRate))
	defer tick.Stop()
	end := time.After(cfg.ChurnFor)
	gens := map[int]int{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			wg.Wait()
			return changes, relabels, ctx.Err()
		case <-end:
			wg.Wait()
			return changes, relabels, firstErr
		case <-tick.C:
		}
		if cfg.Pods > 0 && n%10 == 9 {
			p := rand.IntN(cfg.Pods)
			relabels++
			wg.Go(func() {
				patch := fmt.Sprintf(`{"metadata":{"labels":{"app":"a%d"}}}`, rand.IntN(cfg.Identities))
				if _, err := c.CoreV1().Pods(ScaleNamespace).Patch(ctx, fmt.Sprintf("scale-pod-%d", p), "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
				}
			})
			continue
		}
		i := rand.IntN(cfg.Services)
		gens[i]++
		s := scaleSlice(cfg, i, gens[i], time.Now())
		changes++
		wg.Go(func() {
			if _, err := c.DiscoveryV1().EndpointSlices(ScaleNamespace).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
				mu.Lock()
				firstErr = cmpErr(firstErr, err)
				mu.Unlock()
				return
			}
			last := s.Endpoints[len(s.Endpoints)-1].Addresses[0]
			t, _ := time.Parse(time.RFC3339Nano, s.Annotations[corev1.EndpointsLastChangeTriggerTime])
			select {
			case probe <- churnEvent{svc: i, backend: netip.MustParseAddr(last), at: t}:
			default:
			}
		})
	}
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// cleanScale deletes what a scale run created (also an interrupted earlier
// one): pods at once (no kubelet to wait for), then the rest.
func cleanScale(ctx context.Context, c kubernetes.Interface, workers int) error {
	sel := metav1.ListOptions{LabelSelector: ScaleLabel + "=1"}
	now := metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}
	var errs []error
	errs = append(errs, c.CoreV1().Pods(ScaleNamespace).DeleteCollection(ctx, now, sel),
		c.NetworkingV1().NetworkPolicies(ScaleNamespace).DeleteCollection(ctx, now, sel),
		c.DiscoveryV1().EndpointSlices(ScaleNamespace).DeleteCollection(ctx, now, sel),
		c.CoreV1().Nodes().DeleteCollection(ctx, now, sel))
	svcs, err := c.CoreV1().Services(ScaleNamespace).List(ctx, sel)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	errs = append(errs, workpool.Run(ctx, len(svcs.Items), workers, func(ctx context.Context, i int) error {
		return c.CoreV1().Services(ScaleNamespace).Delete(ctx, svcs.Items[i].Name, now)
	}))
	return errors.Join(errs...)
}
