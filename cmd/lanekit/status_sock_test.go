package main

import (
	"strings"
	"testing"

	apiv1 "github.com/lanekit/lanekit/api/v1"
)

func TestPrintSocketLB(t *testing.T) {
	for _, c := range []struct {
		cp   *apiv1.ControlPlaneStatus
		want []string
	}{
		{&apiv1.ControlPlaneStatus{SocketLb: &apiv1.SocketLBStatus{State: "attached", Cgroup: "/sys/fs/cgroup", NodeAddr: "10.77.0.1"},
			LbCounters:   map[string]uint64{"socket-connect4-translated": 5, "socket-connect6-translated": 1, "socket-sendmsg4-translated": 7, "socket-connect4-no-backend": 2},
			HealthChecks: []*apiv1.HealthCheckStatus{{Namespace: "shop", Name: "web", Port: 31000, LocalEndpoints: 2}, {Namespace: "shop", Name: "db", Port: 31001, Error: "port 31001 is served for shop/web"}}},
			[]string{"socket LB:    attached at /sys/fs/cgroup (loopback NodePorts as 10.77.0.1), translated 6 connects, 7 datagrams, 2 refused",
				"health check: port 31000 for shop/web, 2 local endpoints", "health check: port 31001 for shop/db, NOT SERVED: port 31001 is served for shop/web"}},
		{&apiv1.ControlPlaneStatus{SocketLb: &apiv1.SocketLBStatus{State: "off"}}, []string{"socket LB:    off (lanekitd --socket-lb=false)"}},
	} {
		var b strings.Builder
		printSocketLB(&b, c.cp)
		for _, w := range c.want {
			if !strings.Contains(b.String(), w) {
				t.Errorf("output %q lacks %q", b.String(), w)
			}
		}
	}
}

func TestPrintMasquerade(t *testing.T) {
	cp := &apiv1.ControlPlaneStatus{LbCounters: map[string]uint64{"masquerade": 3, "masquerade-packets": 40}}
	var b strings.Builder
	printMasquerade(&b, &apiv1.RoutingStatus{Mode: "tunnel"}, cp)
	if want := "masquerade:   to outside the cluster (TCP, UDP, ICMP echo over IPv4) from the node's address: 3 flows, 40 packets"; !strings.Contains(b.String(), want) {
		t.Errorf("tunnel mode: %q, want %q", b.String(), want)
	}
	b.Reset()
	printMasquerade(&b, &apiv1.RoutingStatus{Mode: "native"}, cp)
	if b.Len() != 0 {
		t.Errorf("native mode printed %q: it masquerades nothing", b.String())
	}
}
