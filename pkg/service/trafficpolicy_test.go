package service

import (
	"fmt"
	"net/netip"
	"testing"
)

// The translation of traffic policies and external addresses.

var tpOpts = Options{NodeAddrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")},
	LocalPrefixes: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}

// tpService is a Service (spec lines extra, status lines status) on port
// 80 -> 8080 with nodePort 30080 (type NodePort, or LoadBalancer when
// status is set) and one ready endpoint per address.
func tpService(t *testing.T, typ, extra, status string, addrs ...string) *Model {
	t.Helper()
	y := fmt.Sprintf(`
apiVersion: v1
kind: Service
metadata: {name: web, namespace: ns}
spec:
  type: %s
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]
%s
status:
%s
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: ns, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
`, typ, extra, status)
	for _, a := range addrs {
		y += fmt.Sprintf("- addresses: [%s]\n", a)
	}
	if len(addrs) == 0 {
		y = y[:len(y)-1] + " []\n"
	}
	svcs, eps := decode(t, y)
	m, err := Build(svcs, eps, tpOpts)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func fe(m *Model, addr string, port uint16, scope Scope) *Frontend {
	return m.Frontend(FrontendKey{Addr: netip.MustParseAddr(addr), Port: port, Proto: TCP, Scope: scope})
}

// maglevAddrs is the set of backend addresses a frontend's Maglev table uses.
func maglevAddrs(f *Frontend) map[string]bool {
	out := map[string]bool{}
	for _, i := range f.Maglev.Slots() {
		out[f.Backends[i].Addr.String()] = true
	}
	return out
}

func TestTrafficPolicyTranslation(t *testing.T) {
	t.Run("eTP Local: NodePort scope local, ClusterIP scope twin cluster-wide, ClusterIP untouched", func(t *testing.T) {
		m := tpService(t, "NodePort", "  externalTrafficPolicy: Local", "", "10.244.1.5", "10.244.2.5", "10.0.0.1")
		np := fe(m, "10.0.0.1", 30080, ScopeNodePort)
		if np == nil || !np.Local || np.External || len(np.Backends) != 2 || fmt.Sprint(maglevAddrs(np)) != "map[10.0.0.1:true 10.244.1.5:true]" {
			t.Fatalf("NodePort frontend %+v: want Local with the pod CIDR's and the node's own endpoint", np)
		}
		twin := fe(m, "10.0.0.1", 30080, ScopeClusterIP)
		if twin == nil || twin.Local || len(maglevAddrs(twin)) != 3 {
			t.Fatalf("twin %+v: want every endpoint, not Local", twin)
		}
		if c := fe(m, "10.96.0.10", 80, ScopeClusterIP); c == nil || c.Local || len(maglevAddrs(c)) != 3 {
			t.Fatalf("ClusterIP %+v: eTP must not touch it", c)
		}
		if n := len(m.Frontends()); n != 3 {
			t.Fatalf("%d frontends, want 3", n)
		}
	})
	t.Run("eTP Local without a local endpoint: Local with an empty table", func(t *testing.T) {
		np := fe(tpService(t, "NodePort", "  externalTrafficPolicy: Local", "", "10.244.2.5"), "10.0.0.1", 30080, ScopeNodePort)
		if !np.Local || !np.Maglev.None() || np.Eligible() != 0 {
			t.Fatalf("%+v: want Local, no table (the datapath drops: no-local-backend)", np)
		}
	})
	t.Run("eTP Local without any endpoint: not Local (no-backend answers)", func(t *testing.T) {
		np := fe(tpService(t, "NodePort", "  externalTrafficPolicy: Local", ""), "10.0.0.1", 30080, ScopeNodePort)
		if np.Local || !np.Maglev.None() {
			t.Fatalf("%+v: want not Local", np)
		}
	})
	t.Run("eTP Cluster: no twin, nothing Local", func(t *testing.T) {
		m := tpService(t, "NodePort", "  externalTrafficPolicy: Cluster", "", "10.244.1.5", "10.244.2.5")
		if fe(m, "10.0.0.1", 30080, ScopeClusterIP) != nil || fe(m, "10.0.0.1", 30080, ScopeNodePort).Local {
			t.Fatal("eTP Cluster made a twin or a Local frontend")
		}
	})
	t.Run("iTP Local: the ClusterIP local, NodePort cluster-wide", func(t *testing.T) {
		m := tpService(t, "NodePort", "  internalTrafficPolicy: Local", "", "10.244.1.5", "10.244.2.5")
		c := fe(m, "10.96.0.10", 80, ScopeClusterIP)
		if !c.Local || fmt.Sprint(maglevAddrs(c)) != "map[10.244.1.5:true]" {
			t.Fatalf("ClusterIP %+v: want Local, local endpoint only", c)
		}
		if np := fe(m, "10.0.0.1", 30080, ScopeNodePort); np.Local || len(maglevAddrs(np)) != 2 {
			t.Fatalf("NodePort %+v: iTP must not touch it", np)
		}
	})
	t.Run("external IPs and LoadBalancer ingress IPs: NodePort scope frontends on the service port", func(t *testing.T) {
		m := tpService(t, "LoadBalancer", "  externalIPs: [192.0.2.1]\n  sessionAffinity: ClientIP",
			"  loadBalancer: {ingress: [{ip: 198.51.100.1}, {ip: 198.51.100.2, ipMode: Proxy}, {hostname: lb.example}, {ip: 192.0.2.1}]}",
			"10.244.1.5", "10.244.2.5")
		for _, a := range []string{"192.0.2.1", "198.51.100.1"} {
			f := fe(m, a, 80, ScopeNodePort)
			if f == nil || !f.External || f.Local || len(maglevAddrs(f)) != 2 || f.AffinityTimeout == 0 {
				t.Fatalf("%s: %+v; want an External frontend, all endpoints, with affinity", a, f)
			}
		}
		if fe(m, "198.51.100.2", 80, ScopeNodePort) != nil {
			t.Fatal("ipMode Proxy ingress IP programmed")
		}
		// 1 ClusterIP + 1 NodePort + 2 external (the duplicate once).
		if n := len(m.Frontends()); n != 4 {
			t.Fatalf("%d frontends, want 4", n)
		}
	})
	t.Run("eTP Local on external addresses: Local plus the twin", func(t *testing.T) {
		m := tpService(t, "LoadBalancer", "  externalTrafficPolicy: Local\n  healthCheckNodePort: 31000",
			"  loadBalancer: {ingress: [{ip: 198.51.100.1}]}", "10.244.1.5", "10.244.2.5")
		f, twin := fe(m, "198.51.100.1", 80, ScopeNodePort), fe(m, "198.51.100.1", 80, ScopeClusterIP)
		if !f.Local || !f.External || len(maglevAddrs(f)) != 1 || twin == nil || twin.Local || !twin.External || len(maglevAddrs(twin)) != 2 {
			t.Fatalf("external %+v twin %+v", f, twin)
		}
	})
	t.Run("ExternalName and headless: nothing programmed", func(t *testing.T) {
		for _, y := range []string{
			"apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: ns}\nspec: {type: ExternalName, externalName: db.example.com}\n",
			"apiVersion: v1\nkind: Service\nmetadata: {name: b, namespace: ns}\nspec: {clusterIP: None, ports: [{port: 80}]}\n",
		} {
			svcs, eps := decode(t, y)
			m, err := Build(svcs, eps, tpOpts)
			if err != nil || len(m.Frontends()) != 0 || len(m.Services()) != 1 {
				t.Fatalf("%q: %v, %d frontends", y, err, len(m.Frontends()))
			}
		}
	})
}

func TestLocalEndpoints(t *testing.T) {
	svcs, eps := decode(t, `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: ns}
spec: {type: LoadBalancer, clusterIP: 10.96.0.10, externalTrafficPolicy: Local, healthCheckNodePort: 31000, ports: [{port: 80, nodePort: 30080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: ns, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- addresses: [10.244.1.5]
- addresses: [10.244.1.6]
  conditions: {ready: false, serving: true, terminating: true}
- addresses: [10.244.2.5]
- addresses: [10.0.0.1]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-2, namespace: ns, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- addresses: [10.244.1.5]
`)
	if n := LocalEndpoints(svcs[0], eps, tpOpts); n != 2 {
		t.Fatalf("local endpoints %d, want 2 (10.244.1.5 once, the node's own; not terminating, not remote)", n)
	}
}

func TestTrafficPolicyFlags(t *testing.T) {
	m := tpService(t, "NodePort", "  externalTrafficPolicy: Local\n  externalIPs: [192.0.2.1]", "", "10.244.1.5", "10.244.2.5")
	u := NewTables().Apply(Diff(nil, m))
	want := map[string]uint8{
		"10.96.0.10:80/0":  0,
		"10.0.0.1:30080/1": ServiceFlagNodePort | ServiceFlagLocal,
		"10.0.0.1:30080/0": 0,
		"192.0.2.1:80/1":   ServiceFlagNodePort | ServiceFlagLocal | ServiceFlagExternal,
		"192.0.2.1:80/0":   ServiceFlagExternal,
	}
	if len(u.Services) != len(want) {
		t.Fatalf("%d service entries, want %d", len(u.Services), len(want))
	}
	for k, v := range u.Services {
		key := fmt.Sprintf("%s:%d/%d", netip.AddrFrom4(k.Addr), k.Port, k.Scope)
		if f, ok := want[key]; !ok || v.Flags != f {
			t.Errorf("%s: flags %#x, want %#x (listed: %v)", key, v.Flags, f, ok)
		}
	}
}
