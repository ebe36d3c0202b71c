package service

import (
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

func TestParseExternalIPPolicy(t *testing.T) {
	for _, c := range []struct {
		in, want string
		allows   map[string]bool
	}{
		{"all", "all", map[string]bool{"203.0.113.1": true, "2001:db8::1": true}},
		{"none", "none", map[string]bool{"203.0.113.1": false, "2001:db8::1": false}},
		{"203.0.113.0/24, 2001:db8:e::/48", "203.0.113.0/24,2001:db8:e::/48",
			map[string]bool{"203.0.113.9": true, "198.51.100.1": false, "2001:db8:e::1": true, "2001:db8:f::1": false}},
		{"198.51.100.7", "198.51.100.7/32", map[string]bool{"198.51.100.7": true, "198.51.100.8": false}},
	} {
		p, err := ParseExternalIPPolicy(c.in)
		if err != nil || p.String() != c.want {
			t.Errorf("%q: %v %v, want %s", c.in, p, err, c.want)
			continue
		}
		for a, want := range c.allows {
			if got := p.Allows(netip.MustParseAddr(a)); got != want {
				t.Errorf("%q allows %s: %v, want %v", c.in, a, got, want)
			}
		}
	}
	for _, bad := range []string{"", "some", "10.0.0.1/24", "203.0.113.0/24,", "::ffff:10.0.0.0/104", "10.0.0.0/33"} {
		if p, err := ParseExternalIPPolicy(bad); err == nil {
			t.Errorf("%q: accepted as %v", bad, p)
		}
	}
}

// TestExternalIPsGuard: spec.externalIPs outside the allow-list get no
// frontend (nor its externalTrafficPolicy Local twin) and are reported; those
// inside, the cluster IP, the NodePorts and a LoadBalancer's ingress IP
// (set by the controller, not the Service's author) stay.
func TestExternalIPsGuard(t *testing.T) {
	svc := k8sobj.SlimService(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "evil", Name: "grab"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.20", ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			ExternalIPs: []string{"10.96.0.1", "10.244.1.9", "203.0.113.5"},
			Ports:       []corev1.ServicePort{{Name: "http", Port: 443, NodePort: 30443, Protocol: corev1.ProtocolTCP}}},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "198.51.100.9"}}}},
	})
	addrs := func(opts Options) map[string]bool {
		fes, err := Translate(svc, nil, opts)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, f := range fes {
			out[f.Key.Addr.String()] = true
		}
		return out
	}
	base := Options{NodeAddrs: []netip.Addr{netip.MustParseAddr("192.168.1.1")}}
	if got := addrs(base); !got["10.96.0.1"] || !got["10.244.1.9"] || !got["203.0.113.5"] || len(ExternalIPsIgnored(svc, base)) != 0 {
		t.Errorf("default (all): frontends on %v, ignored %v; want every externalIP served", got, ExternalIPsIgnored(svc, base))
	}
	for _, c := range []struct {
		policy string
		served []string
	}{
		{"none", nil},
		{"203.0.113.0/24", []string{"203.0.113.5"}},
	} {
		opts := base
		var err error
		if opts.ExternalIPs, err = ParseExternalIPPolicy(c.policy); err != nil {
			t.Fatal(err)
		}
		got := addrs(opts)
		for _, a := range []string{"10.96.0.20", "192.168.1.1", "198.51.100.9"} {
			if !got[a] {
				t.Errorf("%s: no frontend on %s (cluster IP, node address, ingress IP)", c.policy, a)
			}
		}
		var wantIgnored []Ignored
		for _, a := range svc.Spec.ExternalIPs {
			ip := netip.MustParseAddr(a)
			served := false
			for _, s := range c.served {
				served = served || s == a
			}
			if got[a] != served {
				t.Errorf("%s: frontend on %s: %v, want %v", c.policy, a, got[a], served)
			}
			if !served {
				wantIgnored = append(wantIgnored, Ignored{Addr: ip, Reason: ReasonExternalIPNotAllowed})
			}
		}
		if g := ExternalIPsIgnored(svc, opts); fmt.Sprint(g) != fmt.Sprint(wantIgnored) {
			t.Errorf("%s: ignored %v, want %v", c.policy, g, wantIgnored)
		}
	}
}
