package service

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// TestSCTPPortBesideTCPAndUDP: a Service with TCP, UDP and SCTP ports, and an
// EndpointSlice listing all three, is kept: its TCP and UDP ports get their
// frontends and backends, its SCTP port none (never a TCP frontend in its
// place), and ServiceIgnored reports that port; a hostPort over SCTP likewise.
func TestSCTPPortBesideTCPAndUDP(t *testing.T) {
	svcs, eps := decode(t, `apiVersion: v1
kind: Service
metadata: {name: sig, namespace: tel}
spec:
  clusterIP: 10.96.0.30
  ports:
  - {name: sip-tcp, port: 5060, protocol: TCP}
  - {name: sip-udp, port: 5060, protocol: UDP}
  - {name: sip-sctp, port: 5060, protocol: SCTP}
  - {name: m3ua, port: 2905, protocol: SCTP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sig-1, namespace: tel, labels: {kubernetes.io/service-name: sig}}
addressType: IPv4
ports:
- {name: sip-tcp, port: 5060, protocol: TCP}
- {name: sip-udp, port: 5060, protocol: UDP}
- {name: sip-sctp, port: 5060, protocol: SCTP}
- {name: m3ua, port: 2905, protocol: SCTP}
endpoints:
- {addresses: [10.244.1.7], conditions: {ready: true}}
`)
	fes, err := Translate(svcs[0], eps, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range fes {
		got = append(got, f.Key.Proto.String()+"/"+netip.AddrPortFrom(f.Key.Addr, f.Key.Port).String())
		if len(f.Backends) != 1 || netip.AddrPortFrom(f.Backends[0].Addr, f.Backends[0].Port) != netip.MustParseAddrPort("10.244.1.7:5060") {
			t.Errorf("%s: backends %v, want 10.244.1.7:5060", got[len(got)-1], f.Backends)
		}
	}
	slices.Sort(got)
	if want := []string{"TCP/10.96.0.30:5060", "UDP/10.96.0.30:5060"}; !slices.Equal(got, want) {
		t.Errorf("frontends %v, want %v", got, want)
	}
	ign := ServiceIgnored(svcs[0], Options{})
	if len(ign) != 2 || ign[0].String() != "5060/SCTP" || ign[1].String() != "2905/SCTP" || ign[0].Reason != ReasonProtocolUnsupported {
		t.Errorf("ignored %v, want 5060/SCTP and 2905/SCTP (%s)", ign, ReasonProtocolUnsupported)
	}

	pod := &k8sobj.Pod{
		Namespace: "tel", Name: "p",
		Spec: k8sobj.PodSpec{Containers: []k8sobj.Container{{Name: "c", Ports: []corev1.ContainerPort{
			{ContainerPort: 2905, HostPort: 2905, Protocol: corev1.ProtocolSCTP},
			{ContainerPort: 80, HostPort: 8080, Protocol: corev1.ProtocolTCP}}}}},
		Status: k8sobj.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.1.8"},
	}
	opts := Options{NodeAddrs: []netip.Addr{netip.MustParseAddr("192.168.1.1")}, LocalPrefixes: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}
	hp, ignored := hostPorts(pod, opts)
	if len(hp) != 1 || hp[0].Key.Port != 8080 || hp[0].Key.Proto != TCP {
		t.Errorf("hostPort frontends %v, want TCP 8080 only", hp)
	}
	if len(ignored) != 1 || ignored[0].String() != "2905/SCTP" || ignored[0].Reason != ReasonProtocolUnsupported {
		t.Errorf("hostPorts ignored %v, want 2905/SCTP", ignored)
	}
}
