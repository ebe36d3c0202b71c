package policy

import (
	"fmt"
	"maps"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

func TestPortBlocks(t *testing.T) {
	tests := []struct {
		lo, hi uint16
		want   string
	}{
		{80, 80, "80/16"},
		{80, 81, "80/15"},
		{81, 82, "81/16 82/16"},
		{0, 65535, "0/0"},
		{1000, 2000, "1000/13 1008/12 1024/7 1536/8 1792/9 1920/10 1984/12 2000/16"},
		{65535, 65535, "65535/16"},
		{32768, 65535, "32768/1"},
	}
	for _, tt := range tests {
		var got []string
		covered := 0
		for _, b := range portBlocks(tt.lo, tt.hi) {
			got = append(got, fmt.Sprintf("%d/%d", b.port, b.prefix))
			covered += 1 << (16 - b.prefix)
		}
		if s := strings.Join(got, " "); s != tt.want {
			t.Errorf("portBlocks(%d, %d) = %s, want %s", tt.lo, tt.hi, s, tt.want)
		}
		if covered != int(tt.hi)-int(tt.lo)+1 {
			t.Errorf("portBlocks(%d, %d) covers %d ports", tt.lo, tt.hi, covered)
		}
	}
}

// TestPortRangeLookup: every port of a range is allowed, its neighbours not.
func TestPortRangeLookup(t *testing.T) {
	c := &Compiled{Rules: map[RuleKey]RuleValue{}}
	cp := compiler{c: c, out: c.Rules}
	cp.add(0, 100, Ingress, 200, []portSpec{{ProtoTCP, 1000, 2000}})
	for port := 990; port <= 2010; port++ {
		_, ok := c.Lookup(100, Ingress, 200, ProtoTCP, uint16(port))
		if want := port >= 1000 && port <= 2000; ok != want {
			t.Fatalf("port %d: allowed %v, want %v", port, ok, want)
		}
	}
	if _, ok := c.Lookup(100, Ingress, 200, ProtoUDP, 1500); ok {
		t.Fatal("UDP allowed by a TCP rule")
	}
	if _, ok := c.Lookup(100, Egress, 200, ProtoTCP, 1500); ok {
		t.Fatal("egress allowed by an ingress rule")
	}
}

func testPolicy(ns, name string, sel map[string]string, ingress ...networkingv1.NetworkPolicyIngressRule) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: sel}, Ingress: ingress}}
}

// TestSizeIndependentOfPods: rules are keyed by identity, so 300 pods with the
// same 3 label sets compile to exactly as many rules as 3 pods.
func TestSizeIndependentOfPods(t *testing.T) {
	pol := []*networkingv1.NetworkPolicy{
		testPolicy("a", "p", map[string]string{"app": "web"}, networkingv1.NetworkPolicyIngressRule{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}},
			Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromString("http"))}, {Port: ptr.To(intstr.FromInt32(81))}},
		}),
	}
	pods := func(n int) []Endpoint {
		var eps []Endpoint
		for i := range n {
			eps = append(eps, Endpoint{Namespace: "a", Name: fmt.Sprint(i), IP: netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}),
				Labels:     map[string]string{"app": []string{"web", "db", "client"}[i%3]},
				NamedPorts: []NamedPort{{"http", ProtoTCP, 8080}}})
		}
		return eps
	}
	small, err := Compile(Input{Endpoints: pods(3), Policies: pol}, NewIdentities())
	if err != nil {
		t.Fatal(err)
	}
	big, err := Compile(Input{Endpoints: pods(300), Policies: pol}, NewIdentities())
	if err != nil {
		t.Fatal(err)
	}
	if len(small.Rules) != len(big.Rules) || len(big.Rules) != 3*2 {
		t.Fatalf("rules: %d for 3 pods, %d for 300 pods, want 6 each", len(small.Rules), len(big.Rules))
	}
	if len(big.IPCache) != 300 {
		t.Fatalf("ipcache %d, want 300", len(big.IPCache))
	}
}

func TestIdentities(t *testing.T) {
	ids := NewIdentities()
	a := ids.ForLabels("ns", map[string]string{"x": "1", "y": "2"})
	b := ids.ForLabels("ns", map[string]string{"y": "2", "x": "1"})
	c := ids.ForLabels("other", map[string]string{"x": "1", "y": "2"})
	d := ids.ForLabels("ns", map[string]string{"x": "1"})
	if a != b || a == c || a == d || c == d || a.IsCIDR() {
		t.Fatalf("identities a=%d b=%d c=%d d=%d", a, b, c, d)
	}
	p := ids.ForCIDR(netip.MustParsePrefix("10.1.2.3/16"))
	if p != ids.ForCIDR(netip.MustParsePrefix("10.1.0.0/16")) || !p.IsCIDR() || p == IdentityWorld {
		t.Fatalf("cidr identity %d", p)
	}
	if ids.ForCIDR(netip.MustParsePrefix("0.0.0.0/0")) != IdentityWorld {
		t.Fatal("0.0.0.0/0 is not the world identity")
	}
	if info, _ := ids.Info(a); info.Namespace != "ns" || info.Labels["y"] != "2" {
		t.Fatalf("info %+v", info)
	}
}

func TestIdentityOf(t *testing.T) {
	ids := NewIdentities()
	c := &Compiled{IPCache: map[netip.Addr]Identity{netip.MustParseAddr("10.1.0.5"): 70000}, CIDRs: map[netip.Prefix]Identity{
		netip.MustParsePrefix("0.0.0.0/0"):   IdentityWorld,
		netip.MustParsePrefix("10.0.0.0/8"):  ids.ForCIDR(netip.MustParsePrefix("10.0.0.0/8")),
		netip.MustParsePrefix("10.1.0.0/16"): ids.ForCIDR(netip.MustParsePrefix("10.1.0.0/16")),
	}}
	tests := []struct {
		ip   string
		want Identity
		ep   bool
	}{
		{"10.1.0.5", 70000, true},
		{"10.1.0.6", ids.ForCIDR(netip.MustParsePrefix("10.1.0.0/16")), false},
		{"10.2.0.6", ids.ForCIDR(netip.MustParsePrefix("10.0.0.0/8")), false},
		{"1.1.1.1", IdentityWorld, false},
	}
	for _, tt := range tests {
		id, ep := c.IdentityOf(netip.MustParseAddr(tt.ip))
		if id != tt.want || ep != tt.ep {
			t.Errorf("IdentityOf(%s) = %d %v, want %d %v", tt.ip, id, ep, tt.want, tt.ep)
		}
	}
}

func TestCompileErrorsAndWarnings(t *testing.T) {
	bad := testPolicy("a", "bad", nil, networkingv1.NetworkPolicyIngressRule{
		Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromString("http")), EndPort: ptr.To[int32](90)}}})
	if _, err := Compile(Input{Policies: []*networkingv1.NetworkPolicy{bad}}, NewIdentities()); err == nil ||
		!strings.Contains(err.Error(), "networkpolicy a/bad") || !strings.Contains(err.Error(), "spec.ingress[0].ports[0].endPort") {
		t.Errorf("invalid policy: %v", err)
	}
	dup := []Endpoint{{Namespace: "a", Name: "x", IP: netip.MustParseAddr("10.0.0.1")}, {Namespace: "a", Name: "y", IP: netip.MustParseAddr("10.0.0.1")}}
	if _, err := Compile(Input{Endpoints: dup}, NewIdentities()); err == nil || !strings.Contains(err.Error(), "already used") {
		t.Errorf("duplicate IP: %v", err)
	}
	// Same labels, different numbers for "http": warned, both allowed.
	eps := []Endpoint{
		{Namespace: "a", Name: "x", IP: netip.MustParseAddr("10.0.0.1"), Labels: map[string]string{"app": "web"}, NamedPorts: []NamedPort{{"http", ProtoTCP, 80}}},
		{Namespace: "a", Name: "y", IP: netip.MustParseAddr("10.0.0.2"), Labels: map[string]string{"app": "web"}, NamedPorts: []NamedPort{{"http", ProtoTCP, 8080}}},
	}
	pol := testPolicy("a", "p", nil, networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromString("http"))}}})
	c, err := Compile(Input{Endpoints: eps, Policies: []*networkingv1.NetworkPolicy{pol}}, NewIdentities())
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], `"http"`) {
		t.Fatalf("warnings %v", c.Warnings)
	}
}

// TestDiff: changing one policy touches only its rules; applying the update
// to the old maps yields the new ones.
func TestDiff(t *testing.T) {
	ids := NewIdentities()
	pods := truthPods()
	pols := loadPolicies(t, "testdata/truth.yaml")
	old, err := Compile(Input{Endpoints: pods, NamespaceLabels: truthNSLabels, Policies: pols}, ids)
	if err != nil {
		t.Fatal(err)
	}
	same, _ := Compile(Input{Endpoints: pods, NamespaceLabels: truthNSLabels, Policies: pols}, ids)
	if u := Diff(old, same); u.Ops() != 0 {
		t.Fatalf("recompiling the same input: %s", u)
	}
	changed := append([]*networkingv1.NetworkPolicy{}, pols...)
	np := pols[1].DeepCopy() // alpha/web-from-blue-clients: allow port 81 as well
	np.Spec.Ingress[0].Ports = append(np.Spec.Ingress[0].Ports, networkingv1.NetworkPolicyPort{Port: ptr.To(intstr.FromInt32(81))})
	changed[1] = np
	next, err := Compile(Input{Endpoints: pods, NamespaceLabels: truthNSLabels, Policies: changed}, ids)
	if err != nil {
		t.Fatal(err)
	}
	u := Diff(old, next)
	if len(u.Rules) == 0 || len(u.RulesDelete) != 0 || len(u.IPCache)+len(u.CIDRs)+len(u.Isolated) != 0 {
		t.Fatalf("one port added: %s", u)
	}
	rules := maps.Clone(old.Rules)
	maps.Copy(rules, u.Rules)
	for _, k := range u.RulesDelete {
		delete(rules, k)
	}
	if !maps.Equal(rules, next.Rules) {
		t.Fatal("old rules + update != new rules")
	}
	if u2 := Diff(next, old); len(u2.RulesDelete) != len(u.Rules) {
		t.Fatalf("reverse diff deletes %d, want %d", len(u2.RulesDelete), len(u.Rules))
	}
}

// BenchmarkCompile1000: 1,000 policies over 1,000 pods in 10 namespaces with
// 30 label sets (the policy benchmark shape).
func BenchmarkCompile1000(b *testing.B) {
	var eps []Endpoint
	for i := range 1000 {
		eps = append(eps, Endpoint{Namespace: fmt.Sprintf("ns%d", i%10), Name: fmt.Sprint(i), IP: netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}),
			Labels: map[string]string{"app": fmt.Sprintf("a%d", i%3)}, NamedPorts: []NamedPort{{"http", ProtoTCP, 8080}}})
	}
	var pols []*networkingv1.NetworkPolicy
	for i := range 1000 {
		pols = append(pols, testPolicy(fmt.Sprintf("ns%d", i%10), fmt.Sprintf("p%d", i), map[string]string{"app": fmt.Sprintf("a%d", i%3)},
			networkingv1.NetworkPolicyIngressRule{
				From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{MetadataNameLabel: fmt.Sprintf("ns%d", (i+1)%10)}},
					PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("a%d", (i+1)%3)}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromString("http"))}, {Port: ptr.To(intstr.FromInt32(int32(1000 + i))), EndPort: ptr.To(int32(1100 + i))}},
			}))
	}
	ids := NewIdentities()
	b.ResetTimer()
	var c *Compiled
	for b.Loop() {
		var err error
		if c, err = Compile(Input{Endpoints: eps, Policies: pols}, ids); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(c.Rules)), "rules")
}

// TestCompileSCTPKeepsIsolation: a policy whose only rule allows SCTP still
// isolates the pods it selects (the upstream e2e "should properly isolate
// pods that are selected by a policy allowing SCTP, even if the plugin
// doesn't support SCTP"), and its rule, numeric or named, admits no TCP or
// UDP: the SCTP port resolves to protocol 132, never to TCP.
func TestCompileSCTPKeepsIsolation(t *testing.T) {
	sctp, tcp := corev1.ProtocolSCTP, corev1.ProtocolTCP
	web := netip.MustParseAddr("10.0.0.2")
	client := netip.MustParseAddr("10.0.0.3")
	eps := []Endpoint{
		{Namespace: "a", Name: "web", Labels: map[string]string{"app": "web"}, IP: web,
			NamedPorts: []NamedPort{{Name: "sig", Proto: ProtoSCTP, Port: 5001}}},
		{Namespace: "a", Name: "client", Labels: map[string]string{"app": "client"}, IP: client},
	}
	p := testPolicy("a", "sctp", map[string]string{"app": "web"}, networkingv1.NetworkPolicyIngressRule{
		Ports: []networkingv1.NetworkPolicyPort{
			{Protocol: &sctp, Port: ptr.To(intstr.FromInt32(5000))},
			{Protocol: &sctp, Port: ptr.To(intstr.FromString("sig"))},
			// The named SCTP port asked for as TCP resolves to nothing.
			{Protocol: &tcp, Port: ptr.To(intstr.FromString("sig"))},
		}})
	c, err := Compile(Input{Policies: []*networkingv1.NetworkPolicy{p}, Endpoints: eps}, NewIdentities())
	if err != nil {
		t.Fatalf("SCTP policy refused: %v", err)
	}
	id, _ := c.IdentityOf(web)
	if c.Isolated[id].PolicyIngress == 0 {
		t.Fatalf("web is not isolated for ingress: %+v", c.Isolated)
	}
	for k := range c.Rules {
		if k.Proto != ProtoSCTP {
			t.Errorf("rule %+v: protocol %d, want only SCTP (132)", k, k.Proto)
		}
	}
	for _, port := range []uint16{5000, 5001} {
		for _, proto := range []uint8{ProtoTCP, ProtoUDP} {
			if v := c.Allowed(client, web, proto, port); v.Allowed {
				t.Errorf("client -> web %d/%d allowed (%+v): an SCTP rule must admit no TCP or UDP", port, proto, v)
			}
		}
		if v := c.Allowed(client, web, ProtoSCTP, port); !v.Allowed {
			t.Errorf("client -> web %d/SCTP denied: %+v", port, v)
		}
	}
}

// TestProtoNum: every Kubernetes protocol maps to itself, "" is TCP, and an
// unknown protocol maps to none (never to TCP).
func TestProtoNum(t *testing.T) {
	for _, tc := range []struct {
		in    corev1.Protocol
		want  uint8
		known bool
	}{{"", ProtoTCP, true}, {"TCP", ProtoTCP, true}, {"UDP", ProtoUDP, true}, {"SCTP", ProtoSCTP, true},
		{"tcp", 0, false}, {"ICMP", 0, false}, {"GRE", 0, false}} {
		if got, ok := ProtoNum(tc.in); got != tc.want || ok != tc.known {
			t.Errorf("ProtoNum(%q) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.known)
		}
	}
}
