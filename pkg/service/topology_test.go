package service

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func ptrTo[T any](v T) *T { return &v }

// topoYAML: a ClusterIP Service whose three endpoints carry hints (forNodes
// and forZones as the EndpointSlice controller writes them for
// trafficDistribution), and a Local twin.
func topoYAML(hints [3]string) string {
	return fmt.Sprintf(`
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.0.10
  trafficDistribution: PreferSameNode
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.1.2], nodeName: n1%s}
- {addresses: [10.244.2.2], nodeName: n2%s}
- {addresses: [10.244.3.2], nodeName: n3%s}
`, hints[0], hints[1], hints[2])
}

// TestTopologyHints: kube-proxy's choice for cluster-wide traffic — node
// hints when every ready endpoint has them and one names this node, else
// zone hints likewise, else every endpoint.
func TestTopologyHints(t *testing.T) {
	nodeZone := func(n, z string) string {
		return fmt.Sprintf(", hints: {forNodes: [{name: %s}], forZones: [{name: %s}]}", n, z)
	}
	zoneOnly := func(z string) string { return fmt.Sprintf(", hints: {forZones: [{name: %s}]}", z) }
	all := []string{"10.244.1.2", "10.244.2.2", "10.244.3.2"}
	for _, c := range []struct {
		name       string
		hints      [3]string
		node, zone string
		want       []string
	}{
		{"no hints", [3]string{}, "n1", "a", all},
		{"node hints: this node's endpoint", [3]string{nodeZone("n1", "a"), nodeZone("n2", "a"), nodeZone("n3", "b")}, "n1", "a", []string{"10.244.1.2"}},
		{"node hints, none for this node: the zone's", [3]string{nodeZone("n1", "a"), nodeZone("n2", "a"), nodeZone("n3", "b")}, "n4", "a", []string{"10.244.1.2", "10.244.2.2"}},
		{"node hints, none for this node or zone: all", [3]string{nodeZone("n1", "a"), nodeZone("n2", "a"), nodeZone("n3", "b")}, "n4", "c", all},
		{"zone hints", [3]string{zoneOnly("a"), zoneOnly("b"), zoneOnly("b")}, "n1", "b", []string{"10.244.2.2", "10.244.3.2"}},
		{"one endpoint without hints: all", [3]string{zoneOnly("a"), "", zoneOnly("b")}, "n1", "b", all},
		{"node unknown to the agent: zone", [3]string{nodeZone("n1", "a"), nodeZone("n2", "b"), nodeZone("n3", "b")}, "", "b", []string{"10.244.2.2", "10.244.3.2"}},
	} {
		svcs, eps := decode(t, topoYAML(c.hints))
		fes, err := Translate(svcs[0], eps, Options{NodeName: c.node, Zone: c.zone})
		if err != nil || len(fes) != 1 {
			t.Fatalf("%s: %d frontends, %v", c.name, len(fes), err)
		}
		var got []string
		for _, b := range fes[0].Backends {
			got = append(got, b.Addr.String())
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: backends %v, want %v", c.name, got, c.want)
		}
		if fes[0].Eligible() != len(c.want) {
			t.Errorf("%s: %d eligible in the Maglev table, want %d", c.name, fes[0].Eligible(), len(c.want))
		}
	}
	// Traffic policy Local ignores hints: this node's endpoints.
	svcs, eps := decode(t, topoYAML([3]string{nodeZone("n1", "a"), nodeZone("n2", "a"), nodeZone("n3", "b")}))
	local := "Local"
	svcs[0].Spec.InternalTrafficPolicy = ptrTo(corev1.ServiceInternalTrafficPolicy(local))
	fes, err := Translate(svcs[0], eps, Options{NodeName: "n1", LocalPrefixes: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24")}})
	if err != nil || len(fes) != 1 || len(fes[0].Backends) != 1 || fes[0].Backends[0].Addr.String() != "10.244.2.2" {
		t.Fatalf("internalTrafficPolicy Local with hints for another node: %+v %v", fes, err)
	}
}
