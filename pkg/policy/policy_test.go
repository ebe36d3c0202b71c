package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// The truth-table cluster: 3 namespaces × 3 pods. "web" pods name port 80/TCP
// "http" — except b/web, which names 81 "http" — and 81/UDP "dns".
func truthPods() []Endpoint {
	var eps []Endpoint
	for ni, ns := range []string{"alpha", "beta", "gamma"} {
		for pi, role := range []string{"web", "db", "client"} {
			ep := Endpoint{Namespace: ns, Name: role, IP: netip.AddrFrom4([4]byte{10, 244, byte(ni), byte(pi + 1)}),
				Labels: map[string]string{"app": role, "tier": []string{"front", "back", "front"}[pi]}}
			if role == "web" {
				http := uint16(80)
				if ns == "beta" {
					http = 81
				}
				ep.NamedPorts = []NamedPort{{"http", ProtoTCP, http}, {"dns", ProtoUDP, 81}}
			}
			eps = append(eps, ep)
		}
	}
	return eps
}

var truthNSLabels = map[string]map[string]string{
	"alpha": {"team": "blue"},
	"beta":  {"team": "blue", "env": "prod"},
	"gamma": {"team": "red"},
}

// External addresses around the policies' ipBlocks.
var externals = []string{"192.168.2.5", "192.168.1.5", "172.16.0.1", "10.1.2.3", "10.2.0.1", "8.8.8.8"}

func loadPolicies(t testing.TB, file string) []*networkingv1.NetworkPolicy {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := k8sobj.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	var out []*networkingv1.NetworkPolicy
	for _, o := range objs {
		out = append(out, o.NetworkPolicy)
	}
	return out
}

// TestTruthTable: ≥ 3 namespaces × 3 pods × ports 80/81 × TCP/UDP (plus
// external addresses as sources and destinations) for a policy set covering
// every field; the compiled form and the reference model agree on every cell.
func TestTruthTable(t *testing.T) {
	w := &world{pods: truthPods(), nsLabels: truthNSLabels, policies: loadPolicies(t, "testdata/truth.yaml")}
	c, err := Compile(Input{Endpoints: w.pods, NamespaceLabels: w.nsLabels, Policies: w.policies}, NewIdentities())
	if err != nil {
		t.Fatal(err)
	}
	var addrs []netip.Addr
	for _, p := range w.pods {
		addrs = append(addrs, p.IP)
	}
	for _, e := range externals {
		addrs = append(addrs, netip.MustParseAddr(e))
	}
	cells, allowed := 0, 0
	by := map[string]int{}
	var table strings.Builder
	for _, src := range addrs {
		for _, dst := range addrs {
			if src == dst || (w.pod(src) == nil && w.pod(dst) == nil) {
				continue
			}
			for _, proto := range []uint8{ProtoTCP, ProtoUDP} {
				for _, port := range []uint16{80, 81} {
					cells++
					want := w.allowed(src, dst, proto, port)
					got := c.Allowed(src, dst, proto, port)
					if got.Allowed != want {
						t.Errorf("%s → %s %d/%d: compiled %v (%s), model %v", name(w, src), name(w, dst), port, proto, got.Allowed, got.Reason, want)
					}
					if got.Allowed {
						allowed++
						by[got.Ingress]++
						by[got.Egress]++
					}
					fmt.Fprintf(&table, "%s→%s %d/%d %v\n", name(w, src), name(w, dst), port, proto, want)
				}
			}
		}
	}
	t.Logf("%d cells, %d allowed; allowing policies: %v", cells, allowed, by)
	if allowed == 0 || allowed == cells {
		t.Fatal("truth table is trivial")
	}
	// Every allow policy in the set decides some cell (the set is not dead weight).
	for _, p := range c.Policies {
		if strings.Contains(p.Name, "deny") {
			continue
		}
		if by[p.String()] == 0 {
			t.Errorf("policy %s allowed no cell", p)
		}
	}
	if testing.Verbose() {
		t.Log("\n" + table.String())
	}
}

func name(w *world, ip netip.Addr) string {
	if p := w.pod(ip); p != nil {
		return p.Namespace + "/" + p.Name
	}
	return ip.String()
}

// TestTruthTableSpotChecks pins a few cells by hand, so that a bug shared by
// the compiler and the model (both written here) cannot hide.
func TestTruthTableSpotChecks(t *testing.T) {
	pods := truthPods()
	c, err := Compile(Input{Endpoints: pods, NamespaceLabels: truthNSLabels, Policies: loadPolicies(t, "testdata/truth.yaml")}, NewIdentities())
	if err != nil {
		t.Fatal(err)
	}
	ip := func(ns, pod string) netip.Addr {
		for _, p := range pods {
			if p.Namespace == ns && p.Name == pod {
				return p.IP
			}
		}
		return netip.MustParseAddr(ns)
	}
	tests := []struct {
		src, dst  netip.Addr
		proto     uint8
		port      uint16
		want      bool
		ingressBy string
		egressBy  string
	}{
		// alpha/web: ingress only from client pods of team=blue namespaces on named "http" (80).
		{ip("alpha", "client"), ip("alpha", "web"), ProtoTCP, 80, true, "alpha/web-from-blue-clients", ""},
		{ip("alpha", "client"), ip("alpha", "web"), ProtoTCP, 81, false, "alpha/deny-ingress", ""},
		{ip("gamma", "client"), ip("alpha", "web"), ProtoTCP, 80, false, "alpha/deny-ingress", ""},
		{ip("alpha", "db"), ip("alpha", "web"), ProtoTCP, 80, false, "alpha/deny-ingress", ""},
		// alpha/db: from alpha pods with tier=front, UDP named "dns" on the *db* pod — it has none.
		{ip("alpha", "web"), ip("alpha", "db"), ProtoUDP, 81, false, "alpha/deny-ingress", ""},
		// alpha/db: from 192.168.0.0/16 except 192.168.1.0/24, TCP 80-81.
		{ip("192.168.2.5", ""), ip("alpha", "db"), ProtoTCP, 81, true, "alpha/db-from-ipblock", ""},
		{ip("192.168.1.5", ""), ip("alpha", "db"), ProtoTCP, 81, false, "alpha/deny-ingress", ""},
		// gamma/db: isolated both ways with no rules.
		{ip("alpha", "web"), ip("gamma", "db"), ProtoTCP, 80, false, "gamma/deny-db", ""},
		// gamma/web: egress-only policy; its ingress rules are ignored, so ingress is open.
		{ip("gamma", "web"), ip("gamma", "db"), ProtoTCP, 80, false, "gamma/deny-db", "gamma/egress-only-web"},
		{ip("gamma", "web"), ip("172.16.0.1", ""), ProtoUDP, 80, true, "", "gamma/egress-only-web"},
		{ip("gamma", "web"), ip("8.8.8.8", ""), ProtoUDP, 80, false, "", "gamma/egress-only-web"},
		// beta/web: named "http" is 81 on this pod.
		{ip("gamma", "client"), ip("beta", "web"), ProtoTCP, 81, true, "beta/web-http", ""},
		{ip("gamma", "client"), ip("beta", "web"), ProtoTCP, 80, false, "beta/web-http", ""},
		// beta/client egress: env=prod namespaces on 80-81/TCP, ipBlock, named dns anywhere.
		{ip("beta", "client"), ip("beta", "web"), ProtoTCP, 81, true, "beta/web-http", "beta/client-egress"},
		// the ipBlock 10.0.0.0/8 covers alpha's pods (10.244.0.x): by address.
		{ip("beta", "client"), ip("alpha", "web"), ProtoTCP, 80, true, "alpha/web-from-blue-clients", "beta/client-egress"},
		{ip("beta", "client"), ip("gamma", "web"), ProtoUDP, 81, true, "", "beta/client-egress"},
		{ip("beta", "client"), ip("gamma", "web"), ProtoUDP, 80, false, "", "beta/client-egress"},
		{ip("beta", "client"), ip("10.2.0.1", ""), ProtoTCP, 80, true, "", "beta/client-egress"},
		{ip("beta", "client"), ip("10.1.2.3", ""), ProtoTCP, 80, false, "", "beta/client-egress"},
		// gamma's pods (10.244.2.x) are in the ipBlock's except: gamma/client is 10.244.2.3.
		{ip("beta", "client"), ip("gamma", "client"), ProtoTCP, 82, false, "", "beta/client-egress"},
	}
	for _, tt := range tests {
		v := c.Allowed(tt.src, tt.dst, tt.proto, tt.port)
		if v.Allowed != tt.want || v.Ingress != tt.ingressBy || v.Egress != tt.egressBy {
			t.Errorf("%s → %s %d/%d: got %v by %q/%q (%s), want %v by %q/%q", tt.src, tt.dst, tt.port, tt.proto,
				v.Allowed, v.Ingress, v.Egress, v.Reason, tt.want, tt.ingressBy, tt.egressBy)
		}
	}
}

// randomPolicy builds a valid policy drawing every field at random.
func randomPolicy(rng *rand.Rand, i int) *networkingv1.NetworkPolicy {
	nss := []string{"alpha", "beta", "gamma"}
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	sel := func() *metav1.LabelSelector {
		switch rng.IntN(5) {
		case 0:
			return &metav1.LabelSelector{}
		case 1:
			return &metav1.LabelSelector{MatchLabels: map[string]string{"app": pick("web", "db", "client")}}
		case 2:
			return &metav1.LabelSelector{MatchLabels: map[string]string{"tier": pick("front", "back")}}
		case 3:
			return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpNotIn, Values: []string{pick("web", "db")}}}}
		}
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: pick("tier", "nope"), Operator: metav1.LabelSelectorOpExists}}}
	}
	nsSel := func() *metav1.LabelSelector {
		switch rng.IntN(4) {
		case 0:
			return &metav1.LabelSelector{}
		case 1:
			return &metav1.LabelSelector{MatchLabels: map[string]string{"team": pick("blue", "red")}}
		case 2:
			return &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": pick(nss...)}}
		}
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "env", Operator: metav1.LabelSelectorOpDoesNotExist}}}
	}
	peers := func() []networkingv1.NetworkPolicyPeer {
		var out []networkingv1.NetworkPolicyPeer
		for range rng.IntN(3) {
			switch rng.IntN(4) {
			case 0:
				out = append(out, networkingv1.NetworkPolicyPeer{PodSelector: sel()})
			case 1:
				out = append(out, networkingv1.NetworkPolicyPeer{NamespaceSelector: nsSel()})
			case 2:
				out = append(out, networkingv1.NetworkPolicyPeer{NamespaceSelector: nsSel(), PodSelector: sel()})
			default:
				b := &networkingv1.IPBlock{CIDR: pick("192.168.0.0/16", "10.0.0.0/8", "0.0.0.0/0", "10.244.0.0/16")}
				if rng.IntN(2) == 0 {
					b.Except = []string{map[string]string{"192.168.0.0/16": "192.168.1.0/24", "10.0.0.0/8": "10.1.0.0/16",
						"0.0.0.0/0": "8.8.8.0/24", "10.244.0.0/16": "10.244.1.0/24"}[b.CIDR]}
				}
				out = append(out, networkingv1.NetworkPolicyPeer{IPBlock: b})
			}
		}
		return out
	}
	// named: whether a port may be a name. Not in egress rules with an
	// ipBlock peer: a named port there matches nothing (a documented
	// limitation, a compile warning), the model resolves it on the pod.
	ports := func(named bool) []networkingv1.NetworkPolicyPort {
		var out []networkingv1.NetworkPolicyPort
		for range rng.IntN(3) {
			p := networkingv1.NetworkPolicyPort{}
			if rng.IntN(2) == 0 {
				p.Protocol = ptr.To(corev1.ProtocolUDP)
			} else if rng.IntN(2) == 0 {
				p.Protocol = ptr.To(corev1.ProtocolTCP)
			}
			n := 4
			if !named {
				n = 3
			}
			switch rng.IntN(n) {
			case 0:
			case 1:
				p.Port = ptr.To(intstr.FromInt32(int32(79 + rng.IntN(4))))
			case 2:
				p.Port = ptr.To(intstr.FromInt32(int32(70 + rng.IntN(11))))
				p.EndPort = ptr.To(p.Port.IntVal + int32(rng.IntN(12)))
			default:
				p.Port = ptr.To(intstr.FromString(pick("http", "dns", "none")))
			}
			out = append(out, p)
		}
		return out
	}
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: pick(nss...), Name: fmt.Sprintf("p%d", i)},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *sel()}}
	for range rng.IntN(3) {
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: peers(), Ports: ports(true)})
	}
	for range rng.IntN(3) {
		to := peers()
		ipBlock := slices.ContainsFunc(to, func(p networkingv1.NetworkPolicyPeer) bool { return p.IPBlock != nil })
		np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: to, Ports: ports(!ipBlock)})
	}
	switch rng.IntN(4) {
	case 1:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	case 2:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	case 3:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	}
	return np
}

// TestRandomizedAgainstModel: random policy sets over the truth-table cluster;
// compiled and model agree on every (src, dst, proto, port).
func TestRandomizedAgainstModel(t *testing.T) {
	pods := truthPods()
	var addrs []netip.Addr
	for _, p := range pods {
		addrs = append(addrs, p.IP)
	}
	for _, e := range append(externals, "10.244.9.9", "10.244.1.77") {
		addrs = append(addrs, netip.MustParseAddr(e))
	}
	ids := NewIdentities() // shared across rounds: allocation must be stable
	rounds := 150
	if testing.Short() {
		rounds = 30
	}
	for round := range rounds {
		rng := rand.New(rand.NewPCG(uint64(round), 7))
		w := &world{pods: pods, nsLabels: truthNSLabels}
		for i := range 1 + rng.IntN(5) {
			w.policies = append(w.policies, randomPolicy(rng, i))
		}
		c, err := Compile(Input{Endpoints: pods, NamespaceLabels: truthNSLabels, Policies: w.policies}, ids)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		bad := 0
		for _, src := range addrs {
			for _, dst := range addrs {
				if src == dst {
					continue
				}
				for _, proto := range []uint8{ProtoTCP, ProtoUDP} {
					for _, port := range []uint16{79, 80, 81, 82, 85} {
						want := w.allowed(src, dst, proto, port)
						if got := c.Allowed(src, dst, proto, port); got.Allowed != want && bad < 5 {
							bad++
							t.Errorf("round %d: %s → %s %d/%d: compiled %v (%s), model %v", round, name(w, src), name(w, dst), port, proto, got.Allowed, got.Reason, want)
						}
					}
				}
			}
		}
		if bad > 0 {
			b, _ := k8sobj.Encode(policyObjs(w.policies))
			t.Fatalf("round %d policies:\n%s", round, b)
		}
	}
}

func policyObjs(ps []*networkingv1.NetworkPolicy) []k8sobj.Object {
	var out []k8sobj.Object
	for _, p := range ps {
		out = append(out, k8sobj.Object{Kind: k8sobj.KindNetworkPolicy, NetworkPolicy: p})
	}
	return out
}
