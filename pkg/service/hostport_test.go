package service

import (
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestHostPortFrontends(t *testing.T) {
	opts := Options{
		NodeAddrs:     []netip.Addr{netip.MustParseAddr("192.168.1.1"), netip.MustParseAddr("192.168.2.1")},
		LocalPrefixes: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")},
	}
	pod := func(mut func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{
				{ContainerPort: 80, HostPort: 8080},
				{ContainerPort: 53, HostPort: 5353, Protocol: corev1.ProtocolUDP, HostIP: "0.0.0.0"},
				{ContainerPort: 81, HostPort: 8081, HostIP: "192.168.2.1"},
				{ContainerPort: 82, HostPort: 8082, HostIP: "fd00::1"},
				{ContainerPort: 83},
			}}}},
			Status: corev1.PodStatus{PodIP: "10.244.1.7", Phase: corev1.PodRunning},
		}
		if mut != nil {
			mut(p)
		}
		return p
	}
	fes := HostPortFrontends(pod(nil), opts)
	var got []string
	for _, f := range fes {
		if f.Service != (ServiceID{"ns", "hostport/p"}) || !f.Service.IsHostPort() || f.Key.Scope != ScopeNodePort || len(f.Backends) != 1 || f.Maglev == nil {
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
	if fes := HostPortFrontends(pod(func(p *corev1.Pod) { p.DeletionTimestamp = &now }), opts); len(fes) != 5 {
		t.Errorf("terminating: %d frontends, want 5 (kept until it stops)", len(fes))
	}
	for name, p := range map[string]*corev1.Pod{
		"remote":       pod(func(p *corev1.Pod) { p.Status.PodIP = "10.244.2.7" }),
		"no address":   pod(func(p *corev1.Pod) { p.Status.PodIP = "" }),
		"hostNetwork":  pod(func(p *corev1.Pod) { p.Spec.HostNetwork = true }),
		"succeeded":    pod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
		"no hostPorts": pod(func(p *corev1.Pod) { p.Spec.Containers[0].Ports = p.Spec.Containers[0].Ports[4:] }),
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
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{
			{ContainerPort: 80, HostPort: 8080},
			{ContainerPort: 81, HostPort: 8081, HostIP: "192.168.1.1"},
			{ContainerPort: 82, HostPort: 8082, HostIP: "fd00:77::1"},
		}}}},
		Status: corev1.PodStatus{PodIP: "10.244.1.7", PodIPs: []corev1.PodIP{{IP: "10.244.1.7"}, {IP: "fd00:10:244:1::7"}},
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
