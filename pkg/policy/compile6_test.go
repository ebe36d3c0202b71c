package policy

import (
	"net/netip"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestCompileDualStack: an endpoint's IPv6 address gets the identity of its
// IPv4 one, IPv6 ipBlocks (with except) resolve like IPv4 ones, and the two
// world prefixes are distinct identities (0.0.0.0/0 admits no IPv6, ::/0 no
// IPv4).
func TestCompileDualStack(t *testing.T) {
	addr := netip.MustParseAddr
	eps := []Endpoint{
		{Namespace: "a", Name: "web", IP: addr("10.0.0.2"), IP6: addr("fd00::2"), Labels: map[string]string{"app": "web"}},
		{Namespace: "a", Name: "client", IP: addr("10.0.0.1"), IP6: addr("fd00::1"), Labels: map[string]string{"app": "client"}},
		{Namespace: "a", Name: "v6only", IP6: addr("fd00::3"), Labels: map[string]string{"app": "other"}},
	}
	peers := func(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
		return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
	}
	pol := testPolicy("a", "web", map[string]string{"app": "web"},
		networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}}},
		networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{peers("fd99::/32", "fd99:0:1::/48")}},
		networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{peers("0.0.0.0/0")}},
	)
	c, err := Compile(Input{Endpoints: eps, Policies: []*networkingv1.NetworkPolicy{pol}}, NewIdentities())
	if err != nil {
		t.Fatal(err)
	}
	if c.IPCache[addr("fd00::2")] != c.IPCache[addr("10.0.0.2")] || c.IPCache[addr("fd00::3")] == 0 {
		t.Fatalf("ipcache %v: the IPv6 address does not share its endpoint's identity", c.IPCache)
	}
	if c.CIDRs[netip.MustParsePrefix("::/0")] != IdentityWorld6 || !IdentityWorld6.IsCIDR() {
		t.Fatalf("::/0 is %d, want IdentityWorld6", c.CIDRs[netip.MustParsePrefix("::/0")])
	}
	for _, tt := range []struct {
		src   string
		allow bool
	}{
		{"fd00::1", true},             // the client by identity
		{"10.0.0.1", true},            // ... over IPv4 too
		{"fd00::3", false},            // another pod
		{"fd99:0:2::5", true},         // in the IPv6 ipBlock
		{"fd99:0:1::5", false},        // in its except
		{"fd98::5", false},            // outside: ::/0 is not 0.0.0.0/0
		{"192.168.1.1", true},         // 0.0.0.0/0
		{"::ffff:192.168.1.1", false}, // an IPv4-mapped address is IPv6 here
	} {
		v := c.Allowed(addr(tt.src), addr("fd00::2"), ProtoTCP, 80)
		if tt.src == "10.0.0.1" || tt.src == "192.168.1.1" {
			v = c.Allowed(addr(tt.src), addr("10.0.0.2"), ProtoTCP, 80)
		}
		if v.Allowed != tt.allow {
			t.Errorf("%s -> web: allowed %v (%s), want %v", tt.src, v.Allowed, v.Reason, tt.allow)
		}
	}
	bad := []Endpoint{{Namespace: "a", Name: "x", IP: addr("fd00::9")}}
	if _, err := Compile(Input{Endpoints: bad}, NewIdentities()); err == nil || !strings.Contains(err.Error(), "IPv4 address required") {
		t.Errorf("IPv6 in IP: %v", err)
	}
	bad = []Endpoint{{Namespace: "a", Name: "x", IP6: addr("10.0.0.9")}}
	if _, err := Compile(Input{Endpoints: bad}, NewIdentities()); err == nil || !strings.Contains(err.Error(), "IPv6 address required") {
		t.Errorf("IPv4 in IP6: %v", err)
	}
	mixed := testPolicy("a", "mixed", nil, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{peers("fd99::/32", "10.0.0.0/8")}})
	if _, err := Compile(Input{Policies: []*networkingv1.NetworkPolicy{mixed}}, NewIdentities()); err == nil || !strings.Contains(err.Error(), "family") {
		t.Errorf("an IPv4 except in an IPv6 ipBlock: %v", err)
	}
	dup := []Endpoint{{Namespace: "a", Name: "x", IP6: addr("fd00::9")}, {Namespace: "a", Name: "y", IP6: addr("fd00::9")}}
	if _, err := Compile(Input{Endpoints: dup}, NewIdentities()); err == nil || !strings.Contains(err.Error(), "already used") {
		t.Errorf("duplicate IPv6: %v", err)
	}
}
