package service

import (
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

func TestHostPortFrontends(t *testing.T) {
	opts := Options{
		NodeAddrs:     []netip.Addr{netip.MustParseAddr("192.168.1.1"), netip.MustParseAddr("192.168.2.1")},
		LocalPrefixes: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")},
	}
	pod := func(mut func(*k8sobj.Pod)) *k8sobj.Pod {
		p := &k8sobj.Pod{
			Namespace: "ns", Name: "p",
			Spec: k8sobj.PodSpec{Containers: []k8sobj.Container{{Name: "c", Ports: []corev1.ContainerPort{
				{ContainerPort: 80, HostPort: 8080},
				{ContainerPort: 53, HostPort: 5353, Protocol: corev1.ProtocolUDP, HostIP: "0.0.0.0"},
				{ContainerPort: 81, HostPort: 8081, HostIP: "192.168.2.1"},
				{ContainerPort: 82, HostPort: 8082, HostIP: "fd00::1"},
				{ContainerPort: 83},
			}}}},
			Status: k8sobj.PodStatus{PodIP: "10.244.1.7", Phase: corev1.PodRunning},
		}
		if mut != nil {
			mut(p)
		}
		return p
	}
	fes := HostPortFrontends(pod(nil), opts)
	var got []string
	for _, f := range fes {
		if f.Service != (ServiceID{"ns", "hostport/p"}) || !f.Service.IsHostPort() || f.Key.Scope != ScopeNodePort || len(f.Backends) != 1 || f.Maglev.None() {
			t.Errorf("frontend %+v", f)
		}
		b, _ := f.Select(1)
		got = append(got, f.Key.String()+"->"+netip.AddrPortFrom(b.Addr, b.Port).String())
	}
	want := []string{
		"192.168.1.1:5353/UDP->10.244.1.7:53", "192.168.1.1:8080/TCP->10.244.1.7:80",
		"192.168.2.1:5353/UDP->10.244.1.7:53", "192.168.2.1:8080/TCP->10.244.1.7:80", "192.168.2.1:8081/TCP->10.244.1.7:81",
	}
	if len(got) != len(want) {
		t.Fatalf("frontends %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("frontend %d: %s, want %s", i, got[i], want[i])
		}
	}
	now := metav1.Now()
	if fes := HostPortFrontends(pod(func(p *k8sobj.Pod) { p.DeletionTimestamp = &now }), opts); len(fes) != 5 {
		t.Errorf("terminating: %d frontends, want 5 (kept until it stops)", len(fes))
	}
	for name, p := range map[string]*k8sobj.Pod{
		"remote":       pod(func(p *k8sobj.Pod) { p.Status.PodIP = "10.244.2.7" }),
		"no address":   pod(func(p *k8sobj.Pod) { p.Status.PodIP = "" }),
		"hostNetwork":  pod(func(p *k8sobj.Pod) { p.Spec.HostNetwork = true }),
		"succeeded":    pod(func(p *k8sobj.Pod) { p.Status.Phase = corev1.PodSucceeded }),
		"no hostPorts": pod(func(p *k8sobj.Pod) { p.Spec.Containers[0].Ports = p.Spec.Containers[0].Ports[4:] }),
	} {
		if fes := HostPortFrontends(p, opts); len(fes) != 0 {
			t.Errorf("%s: %d frontends, want none", name, len(fes))
		}
	}
}

// TestHostPortFrontendsDualStack: a dual-stack pod's hostPorts are
// frontends of both families: on the node addresses of each family (hostIP
// unset or unspecified) with the pod's address of that family, on a hostIP
// of one family with the pod's address of that family only.
func TestHostPortFrontendsDualStack(t *testing.T) {
	opts := Options{
		NodeAddrs:     []netip.Addr{netip.MustParseAddr("192.168.1.1"), netip.MustParseAddr("fd00:77::1")},
		LocalPrefixes: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")},
	}
	p := &k8sobj.Pod{
		Namespace: "ns", Name: "p",
		Spec: k8sobj.PodSpec{Containers: []k8sobj.Container{{Name: "c", Ports: []corev1.ContainerPort{
			{ContainerPort: 80, HostPort: 8080},
			{ContainerPort: 81, HostPort: 8081, HostIP: "192.168.1.1"},
			{ContainerPort: 82, HostPort: 8082, HostIP: "fd00:77::1"},
		}}}},
		Status: k8sobj.PodStatus{PodIP: "10.244.1.7", PodIPs: []corev1.PodIP{{IP: "10.244.1.7"}, {IP: "fd00:10:244:1::7"}},
			Phase: corev1.PodRunning},
	}
	var got []string
	for _, f := range HostPortFrontends(p, opts) {
		b, _ := f.Select(1)
		got = append(got, f.Key.String()+"->"+netip.AddrPortFrom(b.Addr, b.Port).String())
	}
	want := []string{
		"192.168.1.1:8080/TCP->10.244.1.7:80", "192.168.1.1:8081/TCP->10.244.1.7:81",
		"[fd00:77::1]:8080/TCP->[fd00:10:244:1::7]:80", "[fd00:77::1]:8082/TCP->[fd00:10:244:1::7]:82",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("frontends\n %v\nwant\n %v", got, want)
	}
	// An IPv6-only pod: the IPv6 half only.
	p.Status.PodIP, p.Status.PodIPs = "fd00:10:244:1::7", []corev1.PodIP{{IP: "fd00:10:244:1::7"}}
	if fes := HostPortFrontends(p, opts); len(fes) != 2 || !fes[0].Key.Addr.Is6() {
		t.Errorf("IPv6-only pod: %d frontends, want the 2 IPv6 ones", len(fes))
	}
}

// TestHostPortForeignHostIP: a hostPort frontend is matched before routing
// for everything the node's pods and processes send, so a hostIP that is not
// this node's own address (another pod's, the metadata service's, the API
// server's; either family) gets none and is reported ignored, while the
// node's own addresses (NodeAddrs, any interface's in HostAddrs, loopback)
// and the pod's other hostPorts stay.
func TestHostPortForeignHostIP(t *testing.T) {
	opts := Options{
		NodeAddrs:     []netip.Addr{netip.MustParseAddr("192.168.1.1"), netip.MustParseAddr("fd00:77::1")},
		HostAddrs:     []netip.Addr{netip.MustParseAddr("10.0.9.9"), netip.MustParseAddr("fd00:99::9"), netip.MustParseAddr("127.0.0.1")},
		LocalPrefixes: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")},
	}
	for _, c := range []struct {
		hostIP string
		served bool
	}{
		{"10.244.1.9", false},         // another pod on this node
		{"10.244.2.9", false},         // a pod on another node
		{"169.254.169.254", false},    // the metadata service
		{"10.96.0.1", false},          // the API server's Service
		{"fd00:10:244:1::9", false},   // another pod, IPv6
		{"fd00:ec2::254", false},      // the IPv6 metadata service
		{"::ffff:192.168.1.1", false}, // an IPv4-mapped node address is not the address
		{"192.168.1.1", true},         // a NodePort address
		{"fd00:77::1", true},
		{"10.0.9.9", true}, // another interface of the node
		{"fd00:99::9", true},
		{"127.0.0.1", true}, // loopback
		{"::1", true},
	} {
		t.Run(c.hostIP, func(t *testing.T) {
			hostIP := netip.MustParseAddr(c.hostIP)
			p := &k8sobj.Pod{
				Namespace: "evil", Name: "p",
				Spec: k8sobj.PodSpec{Containers: []k8sobj.Container{{Name: "c", Ports: []corev1.ContainerPort{
					{ContainerPort: 80, HostPort: 80, HostIP: c.hostIP},
					{ContainerPort: 81, HostPort: 8081}, // every node address: stays
				}}}},
				Status: k8sobj.PodStatus{PodIP: "10.244.1.7", PodIPs: []corev1.PodIP{{IP: "10.244.1.7"}, {IP: "fd00:10:244:1::7"}},
					Phase: corev1.PodRunning},
			}
			onHostIP, others := 0, 0
			for _, f := range HostPortFrontends(p, opts) {
				if f.Key.Port == 80 {
					onHostIP++
					if f.Key.Addr != hostIP {
						t.Errorf("hostPort 80 on %s, want %s", f.Key, hostIP)
					}
				} else {
					others++
				}
			}
			ignored := HostPortsIgnored(p, opts)
			if c.served {
				if onHostIP != 1 || len(ignored) != 0 {
					t.Errorf("node address %s: %d frontends, ignored %v; want 1 and none", hostIP, onHostIP, ignored)
				}
			} else {
				want := []Ignored{{Addr: hostIP, Port: 80, Proto: TCP, Reason: ReasonHostIPNotNode}}
				if onHostIP != 0 || fmt.Sprint(ignored) != fmt.Sprint(want) || ignored[0] != want[0] {
					t.Errorf("foreign hostIP %s: %d frontends, ignored %v; want none and %v", hostIP, onHostIP, ignored, want)
				}
			}
			if others != 2 { // 8081 on each NodePort address, both families
				t.Errorf("the pod's other hostPort: %d frontends, want 2", others)
			}
		})
	}
	// Another node's pod: neither frontends nor anything reported.
	remote := &k8sobj.Pod{
		Namespace: "evil", Name: "r",
		Spec: k8sobj.PodSpec{Containers: []k8sobj.Container{{Name: "c", Ports: []corev1.ContainerPort{
			{ContainerPort: 80, HostPort: 80, HostIP: "169.254.169.254"}}}}},
		Status: k8sobj.PodStatus{PodIP: "10.244.2.7", Phase: corev1.PodRunning},
	}
	if g := HostPortsIgnored(remote, opts); len(g) != 0 {
		t.Errorf("another node's pod: ignored %v, want nothing (not this node's to serve or report)", g)
	}
}
