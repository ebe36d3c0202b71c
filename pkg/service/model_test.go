package service

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

func decode(t testing.TB, y string) ([]*k8sobj.Service, []*k8sobj.EndpointSlice) {
	t.Helper()
	objs, err := k8sobj.Decode([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	var svcs []*k8sobj.Service
	var eps []*k8sobj.EndpointSlice
	for _, o := range objs {
		if o.Service != nil {
			svcs = append(svcs, o.Service)
		}
		if o.EndpointSlice != nil {
			eps = append(eps, o.EndpointSlice)
		}
	}
	return svcs, eps
}

var node = netip.MustParseAddr("192.168.50.1")

const webYAML = `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  ports:
  - {name: http, port: 80, targetPort: http, nodePort: 30080}
  - {name: dns, port: 53, protocol: UDP, targetPort: 5353, nodePort: 30053}
  sessionAffinity: ClientIP
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-a, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}, {name: dns, port: 5353, protocol: UDP}]
endpoints:
- addresses: [10.244.1.5]
  conditions: {ready: true}
- addresses: [10.244.1.6]
  conditions: {ready: false, serving: true, terminating: true}
- addresses: [10.244.1.7]
  conditions: {ready: false}
- addresses: [10.244.1.8]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-b, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 9090}]
endpoints:
- addresses: [10.244.2.9]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: other, namespace: shop, labels: {kubernetes.io/service-name: other}}
addressType: IPv4
ports: [{name: http, port: 1}]
endpoints:
- addresses: [10.244.9.9]
`

func describeBackends(bs []Backend) string {
	var s []string
	for _, b := range bs {
		s = append(s, fmt.Sprintf("%s:%d=%s", b.Addr, b.Port, b.State))
	}
	return strings.Join(s, " ")
}

func TestTranslate(t *testing.T) {
	svcs, eps := decode(t, webYAML)
	fes, err := Translate(svcs[0], eps, Options{NodeAddrs: []netip.Addr{node}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range fes {
		got = append(got, fmt.Sprintf("%s scope=%d port=%s backends=[%s] affinity=%s maglev=%d eligible=%d",
			f.Key, f.Key.Scope, f.PortName, describeBackends(f.Backends), f.AffinityTimeout, f.Maglev.Len(), f.Eligible()))
	}
	want := []string{
		// Named target port "http" resolves per slice: 8080 in web-a, 9090 in web-b.
		"10.96.0.10:53/UDP scope=0 port=dns backends=[10.244.1.5:5353=active 10.244.1.6:5353=terminating 10.244.1.7:5353=not-ready 10.244.1.8:5353=active] affinity=3h0m0s maglev=251 eligible=2",
		"10.96.0.10:80/TCP scope=0 port=http backends=[10.244.1.5:8080=active 10.244.1.6:8080=terminating 10.244.1.7:8080=not-ready 10.244.1.8:8080=active 10.244.2.9:9090=active] affinity=3h0m0s maglev=401 eligible=3",
		"192.168.50.1:30053/UDP scope=1 port=dns backends=[10.244.1.5:5353=active 10.244.1.6:5353=terminating 10.244.1.7:5353=not-ready 10.244.1.8:5353=active] affinity=3h0m0s maglev=251 eligible=2",
		"192.168.50.1:30080/TCP scope=1 port=http backends=[10.244.1.5:8080=active 10.244.1.6:8080=terminating 10.244.1.7:8080=not-ready 10.244.1.8:8080=active 10.244.2.9:9090=active] affinity=3h0m0s maglev=401 eligible=3",
	}
	if len(got) != len(want) {
		t.Fatalf("got %d frontends:\n%s", len(got), strings.Join(got, "\n"))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("frontend %d:\n got %s\nwant %s", i, got[i], want[i])
		}
	}
	// Only active backends take new flows.
	for _, f := range fes {
		for _, bi := range f.Maglev.Slots() {
			if f.Backends[bi].State != BackendActive {
				t.Fatalf("%s: maglev slot points at %s backend", f.Key, f.Backends[bi].State)
			}
		}
	}
}

func TestTranslateCases(t *testing.T) {
	svc := func(extra string) string {
		return "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: ns}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80, targetPort: 8080}]" + extra + "}\n"
	}
	slice := func(conds string) string {
		return "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s-1, namespace: ns, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nports: [{port: 8080}]\nendpoints:\n" + conds
	}
	tests := []struct {
		name     string
		in       string
		wantFE   int
		backends string
		maglev   bool
		affinity time.Duration
	}{
		{"no slices: frontend without backends", svc(""), 1, "", false, 0},
		{"all terminating: fallback to serving terminating", svc("") + slice("- {addresses: [10.0.0.1], conditions: {ready: false, serving: true, terminating: true}}\n- {addresses: [10.0.0.2], conditions: {ready: false, serving: false, terminating: true}}\n"),
			1, "10.0.0.1:8080=terminating 10.0.0.2:8080=not-ready", true, 0},
		{"only not-ready: no new flows", svc("") + slice("- {addresses: [10.0.0.1], conditions: {ready: false}}\n"), 1, "10.0.0.1:8080=not-ready", false, 0},
		{"affinity timeout", svc(", sessionAffinity: ClientIP, sessionAffinityConfig: {clientIP: {timeoutSeconds: 30}}") + slice("- {addresses: [10.0.0.1]}\n"),
			1, "10.0.0.1:8080=active", true, 30 * time.Second},
		{"headless", "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: ns}\nspec: {clusterIP: None}\n", 0, "", false, 0},
		{"slice in another namespace ignored", svc("") + strings.Replace(slice("- {addresses: [10.0.0.1]}\n"), "namespace: ns", "namespace: other", 1), 1, "", false, 0},
		{"same endpoint in two slices: best state", svc("") + slice("- {addresses: [10.0.0.1], conditions: {ready: false}}\n") +
			strings.Replace(slice("- {addresses: [10.0.0.1], conditions: {ready: true}}\n"), "s-1", "s-2", 1), 1, "10.0.0.1:8080=active", true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svcs, eps := decode(t, tt.in)
			fes, err := Translate(svcs[0], eps, Options{NodeAddrs: []netip.Addr{node}})
			if err != nil {
				t.Fatal(err)
			}
			if len(fes) != tt.wantFE {
				t.Fatalf("%d frontends, want %d", len(fes), tt.wantFE)
			}
			if len(fes) == 0 {
				return
			}
			f := fes[0]
			if got := describeBackends(f.Backends); got != tt.backends {
				t.Errorf("backends %q, want %q", got, tt.backends)
			}
			if (!f.Maglev.None()) != tt.maglev {
				t.Errorf("maglev table present = %v, want %v", !f.Maglev.None(), tt.maglev)
			}
			if _, ok := f.Select(12345); ok != tt.maglev {
				t.Errorf("Select ok = %v, want %v", ok, tt.maglev)
			}
			if f.AffinityTimeout != tt.affinity {
				t.Errorf("affinity %s, want %s", f.AffinityTimeout, tt.affinity)
			}
		})
	}
}

func TestBuildErrors(t *testing.T) {
	svcs, eps := decode(t, webYAML)
	clash := svcs[0].DeepCopy()
	clash.Name = "web2"
	if _, err := Build([]*k8sobj.Service{svcs[0], clash}, eps, Options{}); err == nil || !strings.Contains(err.Error(), "already belongs to service shop/web") {
		t.Errorf("frontend clash: err = %v", err)
	}
	if _, err := Build([]*k8sobj.Service{svcs[0], svcs[0]}, eps, Options{}); err == nil || !strings.Contains(err.Error(), "duplicate") {
		t.Errorf("duplicate service: err = %v", err)
	}
	bad := svcs[0].DeepCopy()
	bad.Spec.Ports[0].Port = 0
	if _, err := Build([]*k8sobj.Service{bad}, nil, Options{}); err == nil || !strings.Contains(err.Error(), "spec.ports[0].port") {
		t.Errorf("invalid service: err = %v", err)
	}
}

func TestTranslateFromFile(t *testing.T) {
	b, err := os.ReadFile("../k8sobj/testdata/valid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	svcs, eps := decode(t, string(b))
	m, err := Build(svcs, eps, Options{NodeAddrs: []netip.Addr{node}})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(m.Frontends()); n != 4 {
		t.Fatalf("%d frontends, want 4", n)
	}
	f := m.Frontend(FrontendKey{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Proto: TCP})
	if f == nil || f.AffinityTimeout != time.Minute || len(f.Backends) != 2 {
		t.Fatalf("frontend: %+v", f)
	}
}

// TestTranslateOtherProxy: a Service labelled for another service proxy
// (service.kubernetes.io/service-proxy-name) gets no frontend, as kube-proxy
// leaves it (upstream e2e: Services should implement service-proxy-name).
func TestTranslateOtherProxy(t *testing.T) {
	svcs, eps := decode(t, webYAML)
	if fes, err := Translate(svcs[0], eps, Options{NodeAddrs: []netip.Addr{node}}); err != nil || len(fes) == 0 {
		t.Fatalf("without the label: %d frontends, %v", len(fes), err)
	}
	svcs[0].Labels = map[string]string{ServiceProxyNameLabel: "foo-bar"}
	fes, err := Translate(svcs[0], eps, Options{NodeAddrs: []netip.Addr{node}})
	if err != nil || len(fes) != 0 {
		t.Fatalf("labelled for another proxy: %d frontends, %v; want none", len(fes), err)
	}
}

// TestTranslateHeadlessLabel: an EndpointSlice labelled
// service.kubernetes.io/headless gives no backend, and a Service with the
// label no frontend (upstream e2e: Services should implement
// service.kubernetes.io/headless, which labels a live slice and wants the
// Service down).
func TestTranslateHeadlessLabel(t *testing.T) {
	svcs, eps := decode(t, webYAML)
	opts := Options{NodeAddrs: []netip.Addr{node}}
	fes, err := Translate(svcs[0], eps, opts)
	if err != nil || len(fes) == 0 || fes[0].Maglev.None() {
		t.Fatalf("without the label: %d frontends, %v", len(fes), err)
	}
	for _, es := range eps {
		es.Headless = true // the slice labelled service.kubernetes.io/headless
	}
	fes, err = Translate(svcs[0], eps, opts)
	if err != nil || len(fes) == 0 {
		t.Fatalf("slices labelled headless: %d frontends, %v; want the frontends without backends", len(fes), err)
	}
	for _, f := range fes {
		if len(f.Backends) != 0 || !f.Maglev.None() {
			t.Fatalf("slices labelled headless: %s has %d backends", f.Key, len(f.Backends))
		}
	}
	svcs[0].Labels = map[string]string{HeadlessLabel: ""}
	if fes, err := Translate(svcs[0], nil, opts); err != nil || len(fes) != 0 {
		t.Fatalf("service labelled headless: %d frontends, %v; want none", len(fes), err)
	}
}

// TestEndpointState: the EndpointSlice conditions as kube-proxy reads them. A
// terminating endpoint that is still ready is what the EndpointSlice
// controller publishes for a Service with publishNotReadyAddresses (upstream
// e2e: "should be able to connect to terminating and unready endpoints if
// PublishNotReadyAddresses is true"): it takes new flows.
func TestEndpointState(t *testing.T) {
	b := func(v bool) *bool { return &v }
	for _, c := range []struct {
		name string
		c    discoveryv1.EndpointConditions
		want BackendState
	}{
		{"no conditions", discoveryv1.EndpointConditions{}, BackendActive},
		{"ready", discoveryv1.EndpointConditions{Ready: b(true), Serving: b(true), Terminating: b(false)}, BackendActive},
		{"ready terminating (publishNotReadyAddresses)", discoveryv1.EndpointConditions{Ready: b(true), Serving: b(false), Terminating: b(true)}, BackendActive},
		{"serving terminating", discoveryv1.EndpointConditions{Ready: b(false), Serving: b(true), Terminating: b(true)}, BackendTerminating},
		{"not serving terminating", discoveryv1.EndpointConditions{Ready: b(false), Serving: b(false), Terminating: b(true)}, BackendNotReady},
		{"not ready", discoveryv1.EndpointConditions{Ready: b(false)}, BackendNotReady},
		{"serving, not ready, not terminating", discoveryv1.EndpointConditions{Ready: b(false), Serving: b(true)}, BackendNotReady},
	} {
		es := k8sobj.SlimEndpointSlice(&discoveryv1.EndpointSlice{Endpoints: []discoveryv1.Endpoint{{Conditions: c.c}}})
		if got := endpointState(es.Endpoints[0].Conditions); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}
