package agent

import (
	"net/netip"
	"testing"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/service"
)

const sctpObjects = `
apiVersion: v1
kind: Service
metadata: {name: sig, namespace: tel}
spec:
  clusterIP: 10.96.0.31
  ports:
  - {name: tcp, port: 5060, protocol: TCP}
  - {name: udp, port: 5060, protocol: UDP}
  - {name: sctp, port: 5060, protocol: SCTP}
  - {name: m3ua, port: 2905, protocol: SCTP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sig-1, namespace: tel, labels: {kubernetes.io/service-name: sig}}
addressType: IPv4
ports:
- {name: tcp, port: 5060, protocol: TCP}
- {name: udp, port: 5060, protocol: UDP}
- {name: sctp, port: 5060, protocol: SCTP}
- {name: m3ua, port: 2905, protocol: SCTP}
endpoints: [{addresses: [10.244.1.5]}]
---
apiVersion: v1
kind: Pod
metadata: {name: stp, namespace: tel}
spec:
  nodeName: node-1
  containers:
  - name: c
    image: x
    ports:
    - {containerPort: 2905, hostPort: 2905, hostIP: 192.168.50.1, protocol: SCTP}
    - {containerPort: 2906, hostPort: 2906, hostIP: 192.168.50.1, protocol: SCTP}
    - {containerPort: 8080, hostPort: 8080, hostIP: 192.168.50.1, protocol: TCP}
status: {podIP: 10.244.1.7, phase: Running}
`

// TestSCTPServiceKeptAgent: a Service and its EndpointSlice with TCP, UDP
// and SCTP ports, and a pod with SCTP and TCP hostPorts, are applied twice
// and then resynced whole, as the watcher does: all are kept; the TCP and
// UDP cluster IP frontends and the TCP hostPort resolve to their backends,
// the SCTP ports have no frontend under any protocol (never a TCP one in
// their place), and the agent says so once per object (one log line naming
// its SCTP ports, not one per apply or resync), counting each port as
// protocol-unsupported.
func TestSCTPServiceKeptAgent(t *testing.T) {
	dp := agenttest.NewMemoryDatapath()
	a, logs := newGuardAgent(t, dp, service.ExternalIPPolicy{})
	a.syncServiceHostAddrs([]netip.Addr{ctlNodeAddr})
	for range 2 {
		if err := a.UpsertObjects(decodeObjs(t, sctpObjects)); err != nil {
			t.Fatalf("objects with SCTP ports are refused: %v", err)
		}
	}
	byKind := map[k8sobj.Kind][]k8sobj.Object{}
	for _, o := range decodeObjs(t, sctpObjects) {
		byKind[o.Kind] = append(byKind[o.Kind], o)
	}
	for _, k := range []k8sobj.Kind{k8sobj.KindService, k8sobj.KindEndpointSlice, k8sobj.KindPod} {
		if refused, err := a.ReplaceObjects(k, byKind[k]); err != nil || len(refused) != 0 {
			t.Fatalf("resync of %s: refused %v, %v", k, refused, err)
		}
	}

	vip := netip.MustParseAddr("10.96.0.31").As4()
	for _, proto := range []service.Proto{service.TCP, service.UDP} {
		k := service.ServiceKey{Addr: vip, Port: 5060, Proto: uint8(proto)}
		if got, ok := dp.Resolve(k, 7); !ok || got != netip.MustParseAddrPort("10.244.1.5:5060") {
			t.Errorf("%s cluster IP resolves to %v %v, want 10.244.1.5:5060", proto, got, ok)
		}
	}
	if got, ok := dp.Resolve(hpKey("192.168.50.1", 8080, service.TCP), 7); !ok || got != netip.MustParseAddrPort("10.244.1.7:8080") {
		t.Errorf("the TCP hostPort resolves to %v %v, want 10.244.1.7:8080", got, ok)
	}
	for _, proto := range []service.Proto{service.TCP, service.UDP, service.SCTP} {
		if got, ok := dp.Resolve(service.ServiceKey{Addr: vip, Port: 2905, Proto: uint8(proto)}, 7); ok {
			t.Errorf("the SCTP port 2905 has a %s frontend (-> %v)", proto, got)
		}
		if proto != service.SCTP {
			continue
		}
		if got, ok := dp.Resolve(service.ServiceKey{Addr: vip, Port: 5060, Proto: uint8(proto)}, 7); ok {
			t.Errorf("the SCTP port 5060 has a frontend (-> %v)", got)
		}
	}
	for _, port := range []uint16{2905, 2906} {
		for _, proto := range []service.Proto{service.TCP, service.UDP, service.SCTP} {
			if got, ok := dp.Resolve(hpKey("192.168.50.1", port, proto), 7); ok {
				t.Errorf("the SCTP hostPort %d has a %s frontend (-> %v)", port, proto, got)
			}
		}
	}
	if n, st := logs.count("ports not load-balanced"), a.ControlStats(); n != 2 || st.Ignored[service.ReasonProtocolUnsupported] != 4 {
		t.Errorf("%d log lines (want 2: the Service and the pod, each once over two applies and a resync), ignored %v (want 4 %s)",
			n, st.Ignored, service.ReasonProtocolUnsupported)
	}
}
