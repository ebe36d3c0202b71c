package policy

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// allowPort is a policy isolating app=web's ingress in namespace a and
// allowing port from app=client.
func allowPort(name string, port int32) *networkingv1.NetworkPolicy {
	return testPolicy("a", name, map[string]string{"app": "web"}, networkingv1.NetworkPolicyIngressRule{
		From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
		Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromInt32(port))}},
	})
}

// TestFitLeavesOutWholePolicies: with room for two policies' rules, the
// third (in creation order, then input order) is left out whole, named with
// its map; its pods stay isolated, so its port is denied while the kept
// policies' ports are allowed. An older policy keeps its room: a newer one
// is left out instead. A policy whose ipBlock prefixes do not fit the
// prefix map is left out the same way.
func TestFitLeavesOutWholePolicies(t *testing.T) {
	web, client := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	eps := []Endpoint{
		{Namespace: "a", Name: "web", IP: web, Labels: map[string]string{"app": "web"}, Local: true},
		{Namespace: "a", Name: "client", IP: client, Labels: map[string]string{"app": "client"}, Local: true},
	}
	pols := []*networkingv1.NetworkPolicy{allowPort("p1", 81), allowPort("p2", 82), allowPort("p3", 83)}
	full, err := Compile(Input{Endpoints: eps, Policies: pols}, NewIdentities())
	if err != nil || len(full.Rules) != 3 || len(full.LeftOut) != 0 {
		t.Fatalf("without limits: %d rules, left out %v, %v", len(full.Rules), full.LeftOut, err)
	}
	check := func(c *Compiled, out string, in ...uint16) {
		t.Helper()
		if len(c.LeftOut) != 1 || c.LeftOut[0].Policy.Name != out || c.LeftOut[0].Map != MapRules || c.LeftOut[0].Entries != 1 || c.LeftOut[0].Free != 0 {
			t.Fatalf("left out %+v, want %s in %s (1 entry, none free)", c.LeftOut, out, MapRules)
		}
		if len(c.Rules) != 2 || len(c.Policies) != 3 {
			t.Fatalf("%d rules (limit 2), %d policies (all 3 stay indexed)", len(c.Rules), len(c.Policies))
		}
		for port := uint16(81); port <= 83; port++ {
			if got := c.Allowed(client, web, ProtoTCP, port); got.Allowed != slices.Contains(in, port) {
				t.Errorf("client → web:%d allowed %v (%s), want %v", port, got.Allowed, got.Reason, slices.Contains(in, port))
			}
		}
	}
	c, err := Compile(Input{Endpoints: eps, Policies: pols, Limits: Limits{Rules: 2}}, NewIdentities())
	if err != nil {
		t.Fatal(err)
	}
	check(c, "p3", 81, 82)
	// p3 is the oldest: it keeps its room, the newest (p2) waits.
	now := time.Now()
	for i, p := range pols {
		p.CreationTimestamp = metav1.NewTime(now.Add(time.Duration([]int{1, 2, 0}[i]) * time.Minute))
	}
	if c, err = Compile(Input{Endpoints: eps, Policies: pols, Limits: Limits{Rules: 2}}, NewIdentities()); err != nil {
		t.Fatal(err)
	}
	check(c, "p2", 81, 83)

	// ipBlocks: 0.0.0.0/0 and one prefix fit.
	block := func(name, cidr string) *networkingv1.NetworkPolicy {
		return testPolicy("a", name, map[string]string{"app": "web"}, networkingv1.NetworkPolicyIngressRule{
			From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: cidr}}}})
	}
	c, err = Compile(Input{Endpoints: eps, Policies: []*networkingv1.NetworkPolicy{block("b1", "192.0.2.0/24"), block("b2", "198.51.100.0/24")},
		Limits: Limits{CIDRs: 2}}, NewIdentities())
	if err != nil {
		t.Fatal(err)
	}
	if len(c.LeftOut) != 1 || c.LeftOut[0].Policy.Name != "b2" || c.LeftOut[0].Map != MapCIDRs || len(c.CIDRs) != 3 { // + ::/0
		t.Fatalf("left out %+v, prefixes %v", c.LeftOut, c.CIDRs)
	}
	if !c.Allowed(netip.MustParseAddr("192.0.2.7"), web, ProtoTCP, 80).Allowed || c.Allowed(netip.MustParseAddr("198.51.100.7"), web, ProtoTCP, 80).Allowed {
		t.Error("the kept ipBlock does not admit its prefix, or the left-out one admits its own")
	}
}

// TestFitAddressesLocalFirst: with room for this node's addresses only, the
// remote pods' addresses are left out (counted in Overflow); a local client
// whose egress only a podSelector rule allows towards a remote web is then
// denied (the unknown address resolves as the world), while an ipBlock
// covering the remote address still admits it. Isolation entries of
// identities with no local endpoint go first when that map is full.
func TestFitAddressesLocalFirst(t *testing.T) {
	client, remote := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.1.0.1")
	other := netip.MustParseAddr("10.1.0.2")
	eps := []Endpoint{
		{Namespace: "a", Name: "web", IP: remote, IP6: netip.MustParseAddr("fd00::1"), Labels: map[string]string{"app": "web"}},
		{Namespace: "a", Name: "db", IP: other, Labels: map[string]string{"app": "db"}},
		{Namespace: "a", Name: "client", IP: client, Labels: map[string]string{"app": "client"}, Local: true},
	}
	egress := func(name string, to networkingv1.NetworkPolicyPeer) *networkingv1.NetworkPolicy {
		p := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
				Egress:      []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{to}}}}}
		if to == (networkingv1.NetworkPolicyPeer{}) { // every pod, no rules
			p.Spec.PodSelector, p.Spec.Egress = metav1.LabelSelector{}, nil
		}
		return p
	}
	pols := []*networkingv1.NetworkPolicy{
		egress("to-web", networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}),
		egress("to-db-block", networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.1.0.2/32"}}),
		// isolates the remote pods' egress too (identities with no local endpoint)
		egress("deny-egress", networkingv1.NetworkPolicyPeer{}),
	}
	full, err := Compile(Input{Endpoints: eps, Policies: pols}, NewIdentities())
	if err != nil || !full.Allowed(client, remote, ProtoTCP, 80).Allowed || !full.Allowed(client, other, ProtoTCP, 80).Allowed {
		t.Fatalf("without limits the client does not reach web and db: %v", err)
	}
	c, err := Compile(Input{Endpoints: eps, Policies: pols, Limits: Limits{IPCache: 1, IPCache6: 1, Identities: 1}}, NewIdentities())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.IPCache[client]; !ok || len(c.IPCache) != 2 || c.Overflow[MapIPCache] != 2 || c.Overflow[MapIPCache6] != 0 {
		t.Fatalf("ipcache %v, overflow %v: want the local client's and web's IPv6 address, 2 IPv4 addresses over", c.IPCache, c.Overflow)
	}
	cid, _ := c.IdentityOf(client)
	if _, ok := c.Isolated[cid]; !ok || len(c.Isolated) != 1 || c.Overflow[MapIsolation] != 2 {
		t.Fatalf("isolated %v, overflow %v: want only the local client's identity", c.Isolated, c.Overflow)
	}
	if v := c.Allowed(client, remote, ProtoTCP, 80); v.Allowed {
		t.Errorf("client → the remote web (address left out of the ipcache) allowed: %s; an unknown address must get no podSelector allow", v.Reason)
	}
	if v := c.Allowed(client, other, ProtoTCP, 80); !v.Allowed {
		t.Errorf("client → db (address left out, but an ipBlock admits it) denied: %s", v.Reason)
	}
}

// TestFitRandomizedAgainstModel: random policy sets compiled into random
// small rule and prefix maps fit them, and decide every cell exactly as the
// reference model does for the policy set in which each left-out policy
// keeps its isolation but has no rules: never more than without the limits,
// and everything the kept policies allow.
func TestFitRandomizedAgainstModel(t *testing.T) {
	pods := truthPods()
	for i := range pods {
		pods[i].Local = true
	}
	var addrs []netip.Addr
	for _, p := range pods {
		addrs = append(addrs, p.IP)
	}
	for _, e := range externals {
		addrs = append(addrs, netip.MustParseAddr(e))
	}
	ids := NewIdentities()
	leftSeen := 0
	for round := range 60 {
		rng := rand.New(rand.NewPCG(uint64(round), 41))
		var pols []*networkingv1.NetworkPolicy
		for i := range 2 + rng.IntN(5) {
			pols = append(pols, randomPolicy(rng, i))
		}
		lim := Limits{Rules: 1 + rng.IntN(30), CIDRs: 1 + rng.IntN(4)}
		c, err := Compile(Input{Endpoints: pods, NamespaceLabels: truthNSLabels, Policies: pols, Limits: lim}, ids)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		cidr4 := 0
		for p := range c.CIDRs {
			if p.Addr().Is4() {
				cidr4++
			}
		}
		if len(c.Rules) > lim.Rules || cidr4 > max(lim.CIDRs, 1) {
			t.Fatalf("round %d: %d rules, %d prefixes past limits %+v", round, len(c.Rules), cidr4, lim)
		}
		w := &world{pods: pods, nsLabels: truthNSLabels}
		for i, p := range pols {
			if slices.ContainsFunc(c.LeftOut, func(l LeftOut) bool { return l.Index == i }) {
				p = isolationOnly(p)
				leftSeen++
			}
			w.policies = append(w.policies, p)
		}
		for _, src := range addrs {
			for _, dst := range addrs {
				for _, port := range []uint16{80, 81} {
					if src == dst {
						continue
					}
					if got, want := c.Allowed(src, dst, ProtoTCP, port), w.allowed(src, dst, ProtoTCP, port); got.Allowed != want {
						b, _ := k8sobj.Encode(policyObjs(pols))
						t.Fatalf("round %d (limits %+v, left out %+v): %s → %s:%d compiled %v (%s), model %v\n%s",
							round, lim, c.LeftOut, name(w, src), name(w, dst), port, got.Allowed, got.Reason, want, b)
					}
				}
			}
		}
	}
	if leftSeen == 0 {
		t.Fatal("no round left a policy out: the limits test nothing")
	}
}

// isolationOnly is p with its rules removed: it isolates what p isolates
// and allows nothing.
func isolationOnly(p *networkingv1.NetworkPolicy) *networkingv1.NetworkPolicy {
	q := p.DeepCopy()
	ing, egr := EffectivePolicyTypes(p)
	q.Spec.PolicyTypes = nil
	if ing {
		q.Spec.PolicyTypes = append(q.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
	}
	if egr {
		q.Spec.PolicyTypes = append(q.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
	}
	q.Spec.Ingress, q.Spec.Egress = nil, nil
	return q
}

// TestFitUnpoliced: a local endpoint whose address (the ipcache) or whose
// isolation entry does not fit is named in Unpoliced (the agent refuses its
// ADD); the older local endpoint, first in input order, keeps its room.
func TestFitUnpoliced(t *testing.T) {
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	eps := []Endpoint{
		{Namespace: "a", Name: "old", IP: a, Labels: map[string]string{"app": "web"}, Local: true},
		{Namespace: "a", Name: "new", IP: b, Labels: map[string]string{"app": "db"}, Local: true},
	}
	pols := []*networkingv1.NetworkPolicy{testPolicy("a", "deny", nil)} // isolates both
	for _, c := range []struct {
		what string
		lim  Limits
	}{{"ipcache", Limits{IPCache: 1}}, {"isolation", Limits{Identities: 1}}} {
		got, err := Compile(Input{Endpoints: eps, Policies: pols, Limits: c.lim}, NewIdentities())
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.Unpoliced, []netip.Addr{b}) {
			t.Errorf("%s full: unpoliced %v, want [%v]", c.what, got.Unpoliced, b)
		}
	}
	if got, _ := Compile(Input{Endpoints: eps, Policies: pols, Limits: Limits{IPCache: 2, Identities: 2}}, NewIdentities()); len(got.Unpoliced) != 0 {
		t.Errorf("with room: unpoliced %v", got.Unpoliced)
	}
}
