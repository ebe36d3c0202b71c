package k8stest

import (
	"context"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// Objects written by Store are what creates would have left: a watch sees
// them added, a get returns them defaulted with their system fields and the
// status given, a Service has a free ClusterIP of the range and the
// IPAddress the allocator would have made — so the allocator gives that
// address to no other Service, and deleting the Service frees it.
func TestStore(t *testing.T) {
	s := StartT(t)
	c := kubernetes.NewForConfigOrDie(s.RESTConfig())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := c.CoreV1().Services("default").Watch(ctx, metav1.ListOptions{LabelSelector: "store=1"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	port, name := int32(8080), "http"
	objs := []runtime.Object{
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s1", Namespace: "default", Labels: map[string]string{"store": "1"}},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s2", Namespace: "default", Labels: map[string]string{"store": "1"}},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}},
		&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "s1-x", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "s1"}},
			AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.128.0.5"}}}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p1", Namespace: "default"},
			Spec:   corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "none"}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.128.0.5", PodIPs: []corev1.PodIP{{IP: "10.128.0.5"}}}},
	}
	if err := s.Store(ctx, objs); err != nil {
		t.Fatal(err)
	}
	if objs[0].(*corev1.Service).Spec.ClusterIP != "" {
		t.Error("Store changed the caller's Service")
	}
	for range 2 {
		select {
		case ev := <-w.ResultChan():
			if ev.Type != watch.Added {
				t.Errorf("watch: %s %v, want ADDED", ev.Type, ev.Object)
			}
		case <-ctx.Done():
			t.Fatal("the watch saw no stored Service")
		}
	}
	prefix := netip.MustParsePrefix(s.ServiceCIDR)
	ips := map[string]bool{}
	for _, n := range []string{"s1", "s2"} {
		svc, err := c.CoreV1().Services("default").Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
		if err != nil || !prefix.Contains(ip) || ips[svc.Spec.ClusterIP] {
			t.Errorf("%s: ClusterIP %q, want a free address of %s", n, svc.Spec.ClusterIP, prefix)
		}
		ips[svc.Spec.ClusterIP] = true
		if svc.UID == "" || svc.CreationTimestamp.IsZero() || svc.Spec.Type != corev1.ServiceTypeClusterIP ||
			svc.Spec.SessionAffinity != corev1.ServiceAffinityNone || len(svc.Spec.IPFamilies) != 1 || svc.Spec.Ports[0].Protocol != corev1.ProtocolTCP {
			t.Errorf("%s not as a create stores it: uid %q created %v spec %+v", n, svc.UID, svc.CreationTimestamp, svc.Spec)
		}
		ipa, err := c.NetworkingV1().IPAddresses().Get(ctx, svc.Spec.ClusterIP, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: IPAddress %s: %v", n, svc.Spec.ClusterIP, err)
		}
		if r := ipa.Spec.ParentRef; r == nil || r.Resource != "services" || r.Namespace != "default" || r.Name != n {
			t.Errorf("IPAddress %s: parent %+v, want services default/%s", ipa.Name, r, n)
		}
	}
	pod, err := c.CoreV1().Pods("default").Get(ctx, "p1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP != "10.128.0.5" || pod.UID == "" {
		t.Errorf("pod: uid %q status %+v, want the given status", pod.UID, pod.Status)
	}
	if es, err := c.DiscoveryV1().EndpointSlices("default").Get(ctx, "s1-x", metav1.GetOptions{}); err != nil || es.Endpoints[0].Addresses[0] != "10.128.0.5" || es.UID == "" {
		t.Errorf("slice: %v %+v", err, es)
	}
	// The allocator knows the stored addresses: a Service asking for one
	// is refused, a new one gets another.
	for ip := range ips {
		_, err := c.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "dup", Namespace: "default"},
			Spec: corev1.ServiceSpec{ClusterIP: ip, Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
		if err == nil || !apierrors.IsInvalid(err) {
			t.Errorf("create with stored ClusterIP %s: %v, want refused as allocated", ip, err)
		}
	}
	svc, err := c.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s3", Namespace: "default"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
	if err != nil || ips[svc.Spec.ClusterIP] {
		t.Errorf("a created Service: %v, ClusterIP %s (stored: %v)", err, svc.Spec.ClusterIP, ips)
	}
	if err := s.Store(ctx, objs[3:]); err == nil {
		t.Error("Store overwrote an existing pod")
	}
}

// Store's transactions hold one object each, except a Service and its
// IPAddress, which are never split.
func TestStoreGroupsOneObjectEach(t *testing.T) {
	var objs []runtime.Object
	for i := range 10 {
		objs = append(objs, &corev1.Pod{})
		if i%3 == 0 {
			objs = append(objs, &corev1.Service{}, &networkingv1.IPAddress{})
		}
	}
	objs = append(objs, &corev1.Service{}) // last, without an IPAddress
	var all []runtime.Object
	for _, g := range storeGroups(objs) {
		_, svc := g[0].(*corev1.Service)
		switch {
		case len(g) == 2 && svc:
			if _, ok := g[1].(*networkingv1.IPAddress); !ok {
				t.Errorf("a Service grouped with a %T", g[1])
			}
		case len(g) != 1:
			t.Errorf("a transaction of %d objects (%T first)", len(g), g[0])
		}
		if _, ok := g[0].(*networkingv1.IPAddress); ok {
			t.Error("an IPAddress apart from its Service")
		}
		all = append(all, g...)
	}
	if len(all) != len(objs) {
		t.Fatalf("%d objects in the groups, want %d", len(all), len(objs))
	}
	for i := range all {
		if all[i] != objs[i] {
			t.Fatalf("object %d out of order", i)
		}
	}
}
