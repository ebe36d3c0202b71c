package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// vmLauncherStatus is a launcher pod's network-status as Multus writes it
// for lanekit's VM network (device-info from lanekit's CNI result).
func vmLauncherStatus(deviceType string, ips ...string) string {
	st := []map[string]any{{"name": "lanekit", "ips": []string{"10.244.2.7"}, "default": true},
		{"name": "default/lanekit-vm", "interface": "pod1a2b3c4d5e6", "ips": ips,
			"device-info": map[string]any{"type": deviceType, "version": "1.1.0",
				"vhost-user": map[string]any{"mode": "server", "path": "/var/run/kubevirt/sockets/lanekit-pod1a2b3c4d5e6.sock"}}}}
	raw, _ := json.Marshal(st)
	return string(raw)
}

// vmLauncher is VMI uid's launcher pod name on node with its own pod IP and
// network-status.
func vmLauncher(name, node, uid, podIP, status string) *corev1.Pod {
	p := pod("default", name, node, map[string]string{"kubevirt.io": "virt-launcher", labelCreatedBy: uid, "app": "web"})
	p.Annotations = map[string]string{k8sobj.NetworkStatusAnnotation: status}
	p.Status.PodIPs = []corev1.PodIP{{IP: podIP}}
	p.Status.PodIP = podIP
	return p
}

func sliceOf(addrType discoveryv1.AddressType, pods ...*corev1.Pod) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "default",
		Labels: map[string]string{discoveryv1.LabelServiceName: "web"}}, AddressType: addrType}
	for _, p := range pods {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.Status.PodIP},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name}})
	}
	return es
}

func addrsOf(es *k8sobj.EndpointSlice) []string {
	var out []string
	for _, e := range es.Endpoints {
		out = append(out, e.Addresses...)
	}
	return out
}

// TestVMSliceTrust: a launcher pod's endpoint becomes its VM's lanekit
// address only when that address is trusted; every forged or foreign case
// leaves the slice as the endpointslice controller wrote it.
func TestVMSliceTrust(t *testing.T) {
	nodes := []any{claimNode("node-a", ""), claimNode("node-b", "")}
	plain := pod("default", "plain", "node-a", map[string]string{"app": "web"})
	plain.Status.PodIPs, plain.Status.PodIP = []corev1.PodIP{{IP: "10.244.1.20"}}, "10.244.1.20"
	cases := []struct {
		name string
		pods []*corev1.Pod
		want []string
	}{
		{"launcher → VM", []*corev1.Pod{vmLauncher("virt-launcher-vm1-a", "node-a", "uid-1", "10.244.1.9", vmLauncherStatus("vhost-user", "10.244.1.5"))},
			[]string{"10.244.1.5"}},
		{"a plain pod stays", []*corev1.Pod{plain}, []string{"10.244.1.20"}},
		{"not lanekit's network (no vhost-user device-info)", []*corev1.Pod{vmLauncher("virt-launcher-vm1-a", "node-a", "uid-1", "10.244.1.9", vmLauncherStatus("pci", "10.244.1.5"))},
			[]string{"10.244.1.9"}},
		{"outside every pod CIDR", []*corev1.Pod{vmLauncher("virt-launcher-vm1-a", "node-a", "uid-1", "10.244.1.9", vmLauncherStatus("vhost-user", "192.0.2.5"))},
			[]string{"10.244.1.9"}},
		{"a pod CIDR's broadcast address", []*corev1.Pod{vmLauncher("virt-launcher-vm1-a", "node-a", "uid-1", "10.244.1.9", vmLauncherStatus("vhost-user", "10.244.1.255"))},
			[]string{"10.244.1.9"}},
		// An editor rewrites their launcher pod's network-status to a
		// running pod's address: not taken.
		{"held by another pod", []*corev1.Pod{plain, vmLauncher("virt-launcher-vm1-a", "node-a", "uid-1", "10.244.1.9", vmLauncherStatus("vhost-user", "10.244.1.20"))},
			[]string{"10.244.1.20", "10.244.1.9"}},
		// ... or to another VMI's VM address.
		{"held by another VMI", []*corev1.Pod{
			vmLauncher("virt-launcher-vm2-a", "node-b", "uid-2", "10.244.2.9", vmLauncherStatus("vhost-user", "10.244.2.5")),
			vmLauncher("virt-launcher-vm1-a", "node-a", "uid-1", "10.244.1.9", vmLauncherStatus("vhost-user", "10.244.2.5"))},
			[]string{"10.244.2.9", "10.244.1.9"}},
		{"two addresses of one family: ambiguous", []*corev1.Pod{vmLauncher("virt-launcher-vm1-a", "node-a", "uid-1", "10.244.1.9", vmLauncherStatus("vhost-user", "10.244.1.5", "10.244.1.6"))},
			[]string{"10.244.1.9"}},
		{"not a launcher (no created-by)", []*corev1.Pod{func() *corev1.Pod {
			p := vmLauncher("fake", "node-a", "", "10.244.1.9", vmLauncherStatus("vhost-user", "10.244.1.5"))
			delete(p.Labels, labelCreatedBy)
			return p
		}()}, []string{"10.244.1.9"}},
		// A migration: source and target launcher pods both list the moved
		// address; the VM is one backend.
		{"migrating: one backend", []*corev1.Pod{
			vmLauncher("virt-launcher-vm1-a", "node-a", "uid-1", "10.244.1.9", vmLauncherStatus("vhost-user", "10.244.1.5")),
			vmLauncher("virt-launcher-vm1-b", "node-b", "uid-1", "10.244.2.9", vmLauncherStatus("vhost-user", "10.244.1.5"))},
			[]string{"10.244.1.5"}},
		{"bad network-status JSON", []*corev1.Pod{vmLauncher("virt-launcher-vm1-a", "node-a", "uid-1", "10.244.1.9", `[{"ips": [`)},
			[]string{"10.244.1.9"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pods := podMap{}
			for _, p := range c.pods {
				pods[p.Name] = slimPod(p)
			}
			es := k8sobj.SlimEndpointSlice(sliceOf(discoveryv1.AddressTypeIPv4, c.pods...))
			orig := addrsOf(es)
			out := vmSlice(es, pods, func() []any { return nodes })
			if got := addrsOf(out); !slices.Equal(got, c.want) {
				t.Errorf("addresses %v, want %v", got, c.want)
			}
			if !slices.Equal(addrsOf(es), orig) {
				t.Errorf("the input slice (the informer cache's) changed: %v", addrsOf(es))
			}
		})
	}
	// An IPv6 slice of an IPv4-only VM is left alone.
	l := vmLauncher("virt-launcher-vm1-a", "node-a", "uid-1", "fd00::9", vmLauncherStatus("vhost-user", "10.244.1.5"))
	es := vmSlice(k8sobj.SlimEndpointSlice(sliceOf(discoveryv1.AddressTypeIPv6, l)), podMap{l.Name: slimPod(l)}, func() []any { return nodes })
	if got := addrsOf(es); !slices.Equal(got, []string{"fd00::9"}) {
		t.Errorf("IPv6 slice: %v", got)
	}
}

// TestVMServiceBackendsFromAPIServer: a Service selecting a VM, its slice
// written before Multus wrote the launcher pod's network-status (as it
// happens: the controller lists the pod once it has an IP): the agent gets
// the pod's address first, then — on the annotation's arrival — the VM's.
func TestVMServiceBackendsFromAPIServer(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	n := claimNode("node-a", "192.168.0.1")
	mustCreate(t, e.c.CoreV1().Nodes().Create, n)
	l := vmLauncher("virt-launcher-vm1-a", "node-a", "uid-1", "10.244.1.9", "")
	delete(l.Annotations, k8sobj.NetworkStatusAnnotation)
	st := l.Status
	created := mustCreate(t, e.c.CoreV1().Pods("default").Create, l)
	created.Status = st
	created, err := e.c.CoreV1().Pods("default").UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, e.c.CoreV1().Services("default").Create, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}})
	mustCreate(t, e.c.DiscoveryV1().EndpointSlices("default").Create, sliceOf(discoveryv1.AddressTypeIPv4, created))
	store := newObjectStore()
	run(t, Config{NodeName: "node-a", Client: e.c, Objects: store})
	key := "EndpointSlice/default/web-1"
	got := func() string {
		o, ok := store.get(key)
		if !ok {
			return "none"
		}
		return fmt.Sprint(addrsOf(o.EndpointSlice))
	}
	eventually(t, "the launcher pod's own address first", func() bool { return got() == "[10.244.1.9]" })
	created.Annotations = map[string]string{k8sobj.NetworkStatusAnnotation: vmLauncherStatus("vhost-user", "10.244.1.5")}
	if _, err := e.c.CoreV1().Pods("default").Update(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the VM's address once network-status names it", func() bool { return got() == "[10.244.1.5]" })
}
