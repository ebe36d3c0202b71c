package agent

import (
	"net/netip"
	"testing"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/pkg/service"
)

// TestSCTPServiceKeptAgent: a Service and its EndpointSlice with TCP, UDP
// and SCTP ports are applied (twice, as a resync would) and kept: the TCP
// and UDP cluster IP frontends resolve to the backend, the SCTP port has no
// frontend under any protocol, and the agent says so once (one log line,
// counted as protocol-unsupported), not per apply.
func TestSCTPServiceKeptAgent(t *testing.T) {
	dp := agenttest.NewMemoryDatapath()
	a, logs := newGuardAgent(t, dp, service.ExternalIPPolicy{})
	const svc = `
apiVersion: v1
kind: Service
metadata: {name: sig, namespace: tel}
spec:
  clusterIP: 10.96.0.31
  ports:
  - {name: tcp, port: 5060, protocol: TCP}
  - {name: udp, port: 5060, protocol: UDP}
  - {name: sctp, port: 2905, protocol: SCTP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sig-1, namespace: tel, labels: {kubernetes.io/service-name: sig}}
addressType: IPv4
ports:
- {name: tcp, port: 5060, protocol: TCP}
- {name: udp, port: 5060, protocol: UDP}
- {name: sctp, port: 2905, protocol: SCTP}
endpoints: [{addresses: [10.244.1.5]}]
`
	for range 2 {
		if err := a.UpsertObjects(decodeObjs(t, svc)); err != nil {
			t.Fatalf("a Service with an SCTP port is refused: %v", err)
		}
	}
	vip := netip.MustParseAddr("10.96.0.31").As4()
	for _, proto := range []service.Proto{service.TCP, service.UDP} {
		k := service.ServiceKey{Addr: vip, Port: 5060, Proto: uint8(proto)}
		if got, ok := dp.Resolve(k, 7); !ok || got != netip.MustParseAddrPort("10.244.1.5:5060") {
			t.Errorf("%s cluster IP resolves to %v %v, want 10.244.1.5:5060", proto, got, ok)
		}
	}
	for _, proto := range []service.Proto{service.TCP, service.UDP, service.SCTP} {
		if got, ok := dp.Resolve(service.ServiceKey{Addr: vip, Port: 2905, Proto: uint8(proto)}, 7); ok {
			t.Errorf("the SCTP port 2905 has a %s frontend (-> %v)", proto, got)
		}
	}
	if n, st := logs.count("port not load-balanced"), a.ControlStats(); n != 1 || st.Ignored[service.ReasonProtocolUnsupported] != 1 {
		t.Errorf("%d log lines (want 1 for the Service applied twice), ignored %v (want 1 %s)", n, st.Ignored, service.ReasonProtocolUnsupported)
	}
}
