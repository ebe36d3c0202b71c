package policymodel

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The model is the oracle other tests trust, so its semantics are pinned
// here by hand, one rule at a time, on a two-namespace cluster.
func TestDecide(t *testing.T) {
	policies, err := DecodePolicies(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {namespace: a, name: web-in}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: http}]
  - from: [{namespaceSelector: {matchLabels: {team: blue}}}]
    ports: [{protocol: UDP, port: 70, endPort: 75}]
  - from: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16, 10.244.0.0/16]}}]
---
apiVersion: v1
kind: Namespace
metadata: {name: b, labels: {team: blue}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {namespace: b, name: probe-out}
spec:
  podSelector: {matchLabels: {app: probe}}
  egress: [{to: [{ipBlock: {cidr: 0.0.0.0/0}}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {namespace: b, name: excl}
spec:
  podSelector: {matchLabels: {app: excl}}
  ingress:
  - from: [{ipBlock: {cidr: 10.244.1.0/24}}, {podSelector: {matchLabels: {app: client}}}]
  egress:
  - to: [{ipBlock: {cidr: 10.244.0.0/24, except: [10.244.0.2/32]}}]
`)
	if err != nil {
		t.Fatal(err)
	}
	if len(policies) != 3 {
		t.Fatalf("decoded %d policies, want 3 (the Namespace is skipped)", len(policies))
	}
	ip := netip.MustParseAddr
	m := &Model{
		Pods: []Pod{
			{Name: "web", Namespace: "a", IP: ip("10.244.0.1"), Labels: map[string]string{"app": "web"},
				Ports: []Port{{Name: "http", Port: 8080, Protocol: corev1.ProtocolTCP}}},
			{Name: "client", Namespace: "a", IP: ip("10.244.0.2"), Labels: map[string]string{"app": "client"}},
			{Name: "other", Namespace: "a", IP: ip("10.244.0.3"), Labels: map[string]string{"app": "other"}},
			{Name: "client", Namespace: "b", IP: ip("10.244.1.2"), Labels: map[string]string{"app": "client"}},
			{Name: "probe", Namespace: "b", IP: ip("10.244.1.3"), Labels: map[string]string{"app": "probe"}},
			{Name: "excl", Namespace: "b", IP: ip("10.244.1.4"), Labels: map[string]string{"app": "excl"}},
		},
		NamespaceLabels: map[string]map[string]string{"b": {"team": "blue"}},
		Policies:        policies,
	}
	web, aClient, aOther, bClient, bProbe, bExcl := ip("10.244.0.1"), ip("10.244.0.2"), ip("10.244.0.3"), ip("10.244.1.2"), ip("10.244.1.3"), ip("10.244.1.4")
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	for _, c := range []struct {
		what     string
		src, dst netip.Addr
		proto    corev1.Protocol
		port     int
		want     Verdict
	}{
		{"named port resolves on the receiver", aClient, web, tcp, 8080, Allowed},
		{"named port: other number", aClient, web, tcp, 80, DeniedIngress},
		{"named port: other protocol", aClient, web, udp, 8080, DeniedIngress},
		{"podSelector alone: the policy's namespace only", bClient, web, tcp, 8080, DeniedIngress},
		{"podSelector: unselected pod", aOther, web, tcp, 8080, DeniedIngress},
		{"namespaceSelector + port range, low end", bClient, web, udp, 70, Allowed},
		{"port range, high end", bClient, web, udp, 75, Allowed},
		{"port range, above", bClient, web, udp, 76, DeniedIngress},
		{"port range, other protocol", bClient, web, tcp, 70, DeniedIngress},
		{"namespaceSelector: unselected namespace", aOther, web, udp, 70, DeniedIngress},
		{"ipBlock inside cidr", ip("10.2.0.1"), web, tcp, 1, Allowed},
		{"ipBlock except", ip("10.1.2.3"), web, tcp, 1, DeniedIngress},
		{"ipBlock outside cidr", ip("192.168.0.1"), web, tcp, 1, DeniedIngress},
		{"ipBlock except holds for a pod IP too", aOther, web, tcp, 1, DeniedIngress},
		{"unselected receiver is not isolated", ip("192.168.0.1"), aOther, tcp, 1, Allowed},
		{"egress: ipBlock 0.0.0.0/0 matches a pod IP", bProbe, aOther, tcp, 1, Allowed},
		{"egress: ipBlock with except, pod in the except", bExcl, aClient, tcp, 1, DeniedEgress},
		{"egress: ipBlock with except, pod in the cidr", bExcl, aOther, tcp, 1, Allowed},
		{"egress: ipBlock with except, pod outside the cidr", bExcl, bClient, tcp, 1, DeniedEgress},
		{"ingress: a pod only the ipBlock covers", bProbe, bExcl, tcp, 1, Allowed},
		{"ingress: a pod covered by ipBlock and podSelector", bClient, bExcl, tcp, 1, Allowed},
		{"ingress: a pod neither covers (podSelector is the policy's namespace)", aClient, bExcl, tcp, 1, DeniedIngress},
		{"ingress: a pod outside the ipBlock", web, bExcl, tcp, 1, DeniedIngress},
		{"egress: ipBlock admits an external address", bProbe, ip("8.8.8.8"), tcp, 1, Allowed},
		{"egress is checked first", bExcl, bProbe, tcp, 80, DeniedEgress},
		{"no policyTypes: an egress-only policy isolates ingress too", aOther, bProbe, tcp, 1, DeniedIngress},
		{"no policyTypes: an ingress-only policy leaves egress open", web, ip("8.8.8.8"), tcp, 1, Allowed},
	} {
		if got := m.Decide(c.src, c.dst, c.proto, c.port); got != c.want {
			t.Errorf("%s: %s → %s %s/%d: %s, want %s", c.what, c.src, c.dst, c.proto, c.port, got, c.want)
		}
	}
}
