package agent

import (
	"testing"

	"github.com/lanekit/lanekit/internal/agenttest"
)

// TestDualStackServiceSurvivesRestart: a dual-stack Service goes through the
// agent into the datapath's IPv4 and IPv6 tables, and a restarted agent
// re-adopts the IPv6 frontend's ID from the datapath instead of allocating
// a new one (established IPv6 flows keep their conntrack state).
func TestDualStackServiceSurvivesRestart(t *testing.T) {
	dp := agenttest.NewMemoryDatapath()
	dir := t.TempDir()
	a := newCtlAgent(t, dir, dp)
	const svc = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.0.50
  clusterIPs: [10.96.0.50, "fd00:96::50"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v6, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints: [{addresses: ["fd00:10:244:1::5"]}]
`
	if err := a.UpsertObjects(decodeObjs(t, svc)); err != nil {
		t.Fatal(err)
	}
	// A later IPv4 Service takes the next ID: a restart that adopted the
	// IPv4 frontends only would give the IPv6 one a fresh, higher ID.
	if err := a.UpsertObjects(decodeObjs(t, "apiVersion: v1\nkind: Service\nmetadata: {name: late, namespace: shop}\nspec: {clusterIP: 10.96.0.51, ports: [{port: 53}]}\n")); err != nil {
		t.Fatal(err)
	}
	u, err := dp.DumpServices()
	if err != nil {
		t.Fatal(err)
	}
	if len(u.Services) != 2 || len(u.Services6) != 1 || len(u.Backends6) != 1 || len(u.RevNat6) != 1 {
		t.Fatalf("datapath holds %d IPv4 and %d IPv6 services, %d IPv6 backends, %d IPv6 rev-NAT entries; want 2, 1, 1, 1",
			len(u.Services), len(u.Services6), len(u.Backends6), len(u.RevNat6))
	}
	ids := frontendIDs(a)
	a.st.Close()
	b := newCtlAgent(t, dir, dp)
	if len(ids) != 3 {
		t.Fatalf("frontends %v, want two IPv4 ones and an IPv6 one", ids)
	}
	for k, id := range frontendIDs(b) {
		if ids[k] != id {
			t.Errorf("frontend %v: id %d after restart, was %d", k, id, ids[k])
		}
	}
	if u2, _ := dp.DumpServices(); len(u2.Services6) != 1 || len(u2.Backends6) != 1 {
		t.Errorf("after restart: %d IPv6 services, %d IPv6 backends, want 1 and 1", len(u2.Services6), len(u2.Backends6))
	}
}
