package agent

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/service"
)

// srcRangeSvc is a dual-stack LoadBalancer Service with ingress IPs of both
// families and sourceRanges (a YAML list body, or "" for none) in the field,
// or in the annotation when annotated.
func srcRangeSvc(ranges string, annotated bool) string {
	meta, spec := "{name: lb, namespace: shop}", ""
	switch {
	case ranges != "" && annotated:
		meta = fmt.Sprintf("{name: lb, namespace: shop, annotations: {service.beta.kubernetes.io/load-balancer-source-ranges: %q}}", ranges)
	case ranges != "":
		spec = "\n  loadBalancerSourceRanges: [" + ranges + "]"
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: %s
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.60
  clusterIPs: [10.96.0.60, "fd00:96::60"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30060}]%s
status:
  loadBalancer: {ingress: [{ip: 192.0.2.60}, {ip: "2001:db8:e::60"}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-v4, namespace: shop, labels: {kubernetes.io/service-name: lb}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: ["10.244.1.5"]}]
`, meta, spec)
}

// TestSourceRangesFromObjects: the agent programs a LoadBalancer Service's
// loadBalancerSourceRanges (the field, else the annotation) into the
// datapath for its ingress IPs of each family, and only those: the
// ClusterIPs and NodePorts stay open. A change of the ranges, a restart
// (the entries are adopted, not duplicated or orphaned) and the Service's
// deletion are followed. MemoryDatapath.SourceAllowed decides as
// lb_src_range_ok does; pkg/datapath's TestSourceRangeFixtures runs the
// same translation through the BPF programs.
func TestSourceRangesFromObjects(t *testing.T) {
	dp := agenttest.NewMemoryDatapath()
	dir := t.TempDir()
	a := newCtlAgent(t, dir, dp)
	fk := func(addr string, port uint16, scope service.Scope) service.FrontendKey {
		return service.FrontendKey{Addr: netip.MustParseAddr(addr), Port: port, Proto: service.TCP, Scope: scope}
	}
	lb4, lb6 := fk("192.0.2.60", 80, service.ScopeNodePort), fk("2001:db8:e::60", 80, service.ScopeNodePort)
	open := []service.FrontendKey{fk("10.96.0.60", 80, service.ScopeClusterIP), fk("fd00:96::60", 80, service.ScopeClusterIP),
		fk(ctlNodeAddr.String(), 30060, service.ScopeNodePort)}
	type probe struct {
		key  service.FrontendKey
		src  string
		want bool
	}
	check := func(t *testing.T, what string, probes ...probe) {
		t.Helper()
		for _, p := range probes {
			got, ok := dp.SourceAllowed(p.key, netip.MustParseAddr(p.src))
			if !ok || got != p.want {
				t.Errorf("%s: %s from %s: allowed %v (frontend programmed %v), want %v", what, p.key, p.src, got, ok, p.want)
			}
		}
		for _, k := range open {
			src := "203.0.113.1"
			if k.Addr.Is6() {
				src = "2001:db8:ff::1"
			}
			if got, ok := dp.SourceAllowed(k, netip.MustParseAddr(src)); !ok || !got {
				t.Errorf("%s: %s is limited (allowed %v, programmed %v): only ingress IPs take source ranges", what, k, got, ok)
			}
		}
	}
	if err := a.UpsertObjects(decodeObjs(t, srcRangeSvc(`"198.51.100.0/24", " 2001:db8:1::/48 "`, false))); err != nil {
		t.Fatal(err)
	}
	check(t, "field", probe{lb4, "198.51.100.7", true}, probe{lb4, "203.0.113.1", false}, probe{lb4, "10.244.1.9", false},
		probe{lb6, "2001:db8:1::7", true}, probe{lb6, "2001:db8:2::7", false})

	// A range holding the node's address lets the ingress IP itself in
	// (kube-proxy's allowFromNode; the socket LB asks with it).
	if _, err := a.ApplyObjects([]byte(srcRangeSvc("198.51.100.0,192.168.50.0/24", true))); err == nil ||
		!strings.Contains(err.Error(), "load-balancer-source-ranges") || !strings.Contains(err.Error(), "valid CIDR") {
		t.Fatalf("a malformed annotation entry: %v, want refused with the reason", err)
	}
	check(t, "malformed annotation refused, the field's ranges stay", probe{lb4, "198.51.100.7", true}, probe{lb4, "203.0.113.1", false})
	if err := a.UpsertObjects(decodeObjs(t, srcRangeSvc("198.51.100.0/24, 192.168.50.0/24", true))); err != nil {
		t.Fatal(err)
	}
	check(t, "annotation", probe{lb4, "198.51.100.7", true}, probe{lb4, "192.168.50.1", true}, probe{lb4, "192.0.2.60", true},
		probe{lb4, "203.0.113.1", false},
		// No IPv6 range any more: the IPv6 ingress IP is open (kube-proxy
		// filters the ranges per family).
		probe{lb6, "2001:db8:2::7", true})
	n := dp.SrcRangeEntries()
	if n != 3 {
		t.Fatalf("%d source-range entries, want 3 (two ranges and the ingress IP itself)", n)
	}

	a.st.Close()
	a = newCtlAgent(t, dir, dp)
	check(t, "after restart", probe{lb4, "198.51.100.7", true}, probe{lb4, "203.0.113.1", false})
	if got := dp.SrcRangeEntries(); got != n {
		t.Errorf("after restart: %d source-range entries, want %d", got, n)
	}

	if err := a.UpsertObjects(decodeObjs(t, srcRangeSvc("", false))); err != nil {
		t.Fatal(err)
	}
	check(t, "ranges removed", probe{lb4, "203.0.113.1", true}, probe{lb6, "2001:db8:2::7", true})
	if got := dp.SrcRangeEntries(); got != 0 {
		t.Errorf("%d source-range entries left after the ranges were removed", got)
	}
	if err := a.UpsertObjects(decodeObjs(t, srcRangeSvc(`"198.51.100.0/24"`, false))); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteObject(k8sobj.KindService, "shop", "lb"); err != nil {
		t.Fatal(err)
	}
	if got := dp.SrcRangeEntries(); got != 0 {
		t.Errorf("%d source-range entries left after the Service was deleted", got)
	}
}
