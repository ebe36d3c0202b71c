package agent

import (
	"net/netip"
	"testing"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/service"
)

// hostPortPods: a local pod with the three hostPorts of the upstream e2e
// test (same port, different hostIP and protocol) plus one on every node
// address, and a remote pod with a hostPort (another node's to serve).
const hostPortPods = `
apiVersion: v1
kind: Pod
metadata: {name: hp, namespace: shop}
spec:
  nodeName: node-1
  containers:
  - name: c
    image: x
    ports:
    - {containerPort: 8080, hostPort: 54323, hostIP: 127.0.0.1}
    - {containerPort: 8081, hostPort: 54323, hostIP: 192.168.50.1}
    - {containerPort: 8082, hostPort: 54323, hostIP: 192.168.50.1, protocol: UDP}
    - {name: web, containerPort: 80, hostPort: 8000}
status: {podIP: 10.244.1.5, phase: Running}
---
apiVersion: v1
kind: Pod
metadata: {name: hp-remote, namespace: shop}
spec:
  nodeName: node-2
  containers: [{name: c, image: x, ports: [{containerPort: 80, hostPort: 8001}]}]
status: {podIP: 10.244.2.5, phase: Running}
`

func hpKey(addr string, port uint16, proto service.Proto) service.ServiceKey {
	return service.ServiceKey{Addr: netip.MustParseAddr(addr).As4(), Port: port, Proto: uint8(proto), Scope: uint8(service.ScopeNodePort)}
}

// TestHostPorts: a local pod's hostPorts become NodePort-scope frontends with
// the pod as the one backend (each hostIP and protocol its own, 0.0.0.0 on
// every node address); a remote pod's do not; they survive a restart of the
// agent, go with the pod, and a Service's NodePort wins over a hostPort.
func TestHostPorts(t *testing.T) {
	dp := agenttest.NewMemoryDatapath()
	dir := t.TempDir()
	a := newCtlAgent(t, dir, dp)
	if err := a.UpsertObjects(decodeObjs(t, hostPortPods)); err != nil {
		t.Fatal(err)
	}
	want := map[service.ServiceKey]netip.AddrPort{
		hpKey("127.0.0.1", 54323, service.TCP):    netip.MustParseAddrPort("10.244.1.5:8080"),
		hpKey("192.168.50.1", 54323, service.TCP): netip.MustParseAddrPort("10.244.1.5:8081"),
		hpKey("192.168.50.1", 54323, service.UDP): netip.MustParseAddrPort("10.244.1.5:8082"),
		hpKey("192.168.50.1", 8000, service.TCP):  netip.MustParseAddrPort("10.244.1.5:80"),
	}
	check := func(when string) {
		t.Helper()
		for k, be := range want {
			if got, ok := dp.Resolve(k, 7); !ok || got != be {
				t.Errorf("%s: %v -> %v %v, want %v", when, k, got, ok, be)
			}
		}
		if _, ok := dp.Resolve(hpKey("192.168.50.1", 8001, service.TCP), 7); ok {
			t.Errorf("%s: a remote pod's hostPort is programmed here", when)
		}
	}
	check("after upsert")
	if st := a.ControlStats(); st.Frontends != 4 {
		t.Errorf("frontends %d, want 4", st.Frontends)
	}

	// A restart rebuilds them from the stored pods.
	a.st.Close()
	a = newCtlAgent(t, dir, dp)
	check("after restart")

	// A Service's NodePort on the same port takes it; the other hostPorts stay.
	if err := a.UpsertObjects(decodeObjs(t, `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 8000}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.244.2.2]}]
`)); err != nil {
		t.Fatal(err)
	}
	if got, ok := dp.Resolve(hpKey("192.168.50.1", 8000, service.TCP), 7); !ok || got != netip.MustParseAddrPort("10.244.2.2:8080") {
		t.Errorf("node port 8000 -> %v %v, want the Service's backend", got, ok)
	}
	delete(want, hpKey("192.168.50.1", 8000, service.TCP))
	check("beside the Service")

	// The pod goes: so do its hostPorts.
	if err := a.DeleteObject(k8sobj.KindPod, "shop", "hp"); err != nil {
		t.Fatal(err)
	}
	for k := range want {
		if _, ok := dp.Resolve(k, 7); ok {
			t.Errorf("after the pod's deletion %v is still programmed", k)
		}
	}
}
