package agent

import (
	"encoding/json"
	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/pkg/service"
)

const hcService = `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.20
  externalTrafficPolicy: Local
  healthCheckNodePort: 31500
  ports: [{port: 80, targetPort: 8080, nodePort: 30090}]
`

func hcSlice(addrs ...string) string {
	y := `
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
`
	for _, a := range addrs {
		y += "- addresses: [" + a + "]\n"
	}
	if len(addrs) == 0 {
		y = y[:len(y)-1] + " []\n"
	}
	return y
}

// TestHealthCheckNodePort: the agent serves a LoadBalancer eTP Local
// Service's healthCheckNodePort with kube-proxy's answer — 200 and the count
// of this node's ready endpoints, 503 with none — following endpoint
// changes, and closes it when the Service no longer asks for it.
func TestHealthCheckNodePort(t *testing.T) {
	a := newCtlAgent(t, t.TempDir(), agenttest.NewMemoryDatapath())
	var mu sync.Mutex
	addrs := map[uint16]string{} // Service port -> where the test listener is
	a.health = &healthChecks{log: quietLog(), byID: map[service.ServiceID]*hcServer{}, listen: func(port uint16) (net.Listener, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err == nil {
			mu.Lock()
			addrs[port] = ln.Addr().String()
			mu.Unlock()
		}
		return ln, err
	}}
	t.Cleanup(a.health.close)
	get := func(t *testing.T) (int, hcBody, http.Header) {
		t.Helper()
		mu.Lock()
		addr := addrs[31500]
		mu.Unlock()
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b hcBody
		if err := json.NewDecoder(resp.Body).Decode(&b); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, b, resp.Header
	}
	// Two local ready endpoints (one in two slices' worth of addresses), a remote one.
	if _, err := a.ApplyObjects([]byte(hcService + "---" + hcSlice("10.244.1.5", "10.244.1.6", "10.244.2.5"))); err != nil {
		t.Fatal(err)
	}
	code, b, h := get(t)
	if code != 200 || b.LocalEndpoints != 2 || !b.ServiceProxyHealthy || b.Service.Namespace != "shop" || b.Service.Name != "web" ||
		h.Get("Content-Type") != "application/json" || h.Get("X-Load-Balancing-Endpoint-Weight") != "2" {
		t.Fatalf("got %d %+v %v; want 200 with 2 local endpoints", code, b, h)
	}
	if l := a.HealthChecks(); len(l) != 1 || l[0].Port != 31500 || l[0].LocalEndpoints != 2 || l[0].Err != "" {
		t.Fatalf("HealthChecks() = %+v", l)
	}
	// Only remote endpoints: 503.
	if _, err := a.ApplyObjects([]byte(hcSlice("10.244.2.5"))); err != nil {
		t.Fatal(err)
	}
	if code, b, _ := get(t); code != 503 || b.LocalEndpoints != 0 {
		t.Fatalf("got %d %+v; want 503 with 0 local endpoints", code, b)
	}
	// externalTrafficPolicy Cluster: no health check port any more.
	if _, err := a.ApplyObjects([]byte(
		"apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\n" +
			"spec: {type: LoadBalancer, clusterIP: 10.96.0.20, ports: [{port: 80, targetPort: 8080, nodePort: 30090}]}\n")); err != nil {
		t.Fatal(err)
	}
	if l := a.HealthChecks(); len(l) != 0 {
		t.Fatalf("HealthChecks() = %+v after eTP Cluster", l)
	}
	mu.Lock()
	addr := addrs[31500]
	mu.Unlock()
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatal("the health check port is still open")
	}
}
