package k8sobj

import (
	"encoding/json"
	"reflect"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fullPod is a pod as the API server serves it: what lanekit reads and much
// it does not.
func fullPod() *corev1.Pod {
	always := corev1.ContainerRestartPolicyAlways
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", GenerateName: "web-", Namespace: "shop", UID: "u-1", ResourceVersion: "42",
			Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"kubernetes.io/egress-bandwidth": "10M"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web", UID: "rs-1"}},
			Finalizers:      []string{"example.com/f"}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec: corev1.PodSpec{NodeName: "node-1", HostNetwork: true,
			InitContainers: []corev1.Container{{Name: "init", Image: "x"},
				{Name: "side", Image: "s", RestartPolicy: &always, Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9090}}}},
			Containers: []corev1.Container{{Name: "c", Image: "busybox", Env: []corev1.EnvVar{{Name: "E", Value: "v"}},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, HostPort: 30080, Protocol: corev1.ProtocolTCP}}},
				{Name: "noports", Image: "y"}},
			Volumes: []corev1.Volume{{Name: "data"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Reason: "r", HostIP: "192.168.1.1", HostIPs: []corev1.HostIP{{IP: "192.168.1.1"}},
			PodIP: "10.244.1.7", PodIPs: []corev1.PodIP{{IP: "10.244.1.7"}, {IP: "fd00::7"}},
			Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "c", Image: "busybox"}}},
	}
}

// TestSlimPod: a Pod keeps every field lanekit reads of a corev1.Pod and
// none of the rest, in a struct a third of a corev1.Pod's size.
func TestSlimPod(t *testing.T) {
	p := SlimPod(fullPod())
	always := corev1.ContainerRestartPolicyAlways
	want := &Pod{
		Name: "web-1", Namespace: "shop", UID: "u-1", ResourceVersion: "42",
		Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"kubernetes.io/egress-bandwidth": "10M"},
		Spec: PodSpec{NodeName: "node-1", HostNetwork: true,
			InitContainers: []Container{{Name: "side", RestartPolicy: &always, Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9090}}}},
			Containers:     []Container{{Name: "c", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, HostPort: 30080, Protocol: corev1.ProtocolTCP}}}}},
		Status: PodStatus{Phase: corev1.PodRunning, Reason: "r", HostIP: "192.168.1.1", HostIPs: []corev1.HostIP{{IP: "192.168.1.1"}},
			PodIP: "10.244.1.7", PodIPs: []corev1.PodIP{{IP: "10.244.1.7"}, {IP: "fd00::7"}}},
	}
	if !reflect.DeepEqual(p, want) {
		t.Errorf("SlimPod:\n got %+v\nwant %+v", p, want)
	}
	// Its own metadata, not a metav1.ObjectMeta and TypeMeta (264 bytes).
	if sz := unsafe.Sizeof(Pod{}); sz > 320 {
		t.Errorf("a Pod is %d bytes, want <= 320 (a corev1.Pod is %d)", sz, unsafe.Sizeof(corev1.Pod{}))
	}
	// A copy shares nothing: changing it leaves the pod alone.
	c := p.DeepCopy()
	if !reflect.DeepEqual(c, p) {
		t.Fatalf("DeepCopy: %+v, want %+v", c, p)
	}
	c.Labels["app"] = "x"
	c.Spec.Containers[0].Ports[0].HostPort = 1
	*c.Spec.InitContainers[0].RestartPolicy = corev1.ContainerRestartPolicy("Never")
	c.Status.PodIPs[0].IP = "10.0.0.1"
	c.Status.HostIPs[0].IP = "10.0.0.2"
	if !reflect.DeepEqual(p, want) {
		t.Errorf("changing a DeepCopy changed the pod: %+v", p)
	}
	if o, ok := p.DeepCopyObject().(*Pod); !ok || !reflect.DeepEqual(o, p) {
		t.Errorf("DeepCopyObject: %+v", o)
	}
}

// TestSlimPodJSON: a Pod encodes as a v1 Pod (what the store keeps) and
// decodes back to itself through Decode, which reads the v1 Pod strictly.
func TestSlimPodJSON(t *testing.T) {
	o := Object{Kind: KindPod, Pod: SlimPod(fullPod())}
	raw, err := EncodeJSON(o)
	if err != nil {
		t.Fatal(err)
	}
	var full corev1.Pod
	if err := json.Unmarshal(raw, &full); err != nil || full.Spec.Containers[0].Ports[0].HostPort != 30080 || full.Status.PodIPs[1].IP != "fd00::7" {
		t.Fatalf("not a v1 Pod: %v %s", err, raw)
	}
	back, err := DecodeJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Pod, o.Pod) {
		t.Errorf("decoded\n %+v\nwant\n %+v", back.Pod, o.Pod)
	}
	// A file's full pod decodes to its slim form.
	fb, _ := json.Marshal(fullPod())
	var m map[string]any
	_ = json.Unmarshal(fb, &m)
	m["apiVersion"], m["kind"] = "v1", "Pod"
	fb, _ = json.Marshal(m)
	got, err := DecodeJSON(fb)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Pod, o.Pod) {
		t.Errorf("a full pod decoded to\n %+v\nwant\n %+v", got.Pod, o.Pod)
	}
	// And through its own UnmarshalJSON (a pod stored whole by an older
	// agent, read back).
	var p Pod
	if err := json.Unmarshal(fb, &p); err != nil || !reflect.DeepEqual(&p, o.Pod) {
		t.Errorf("json.Unmarshal of a full pod: %v\n %+v\nwant\n %+v", err, &p, o.Pod)
	}
}

// TestEncodeLeavesObjectAlone: encoding (the store writes every object it
// is given) sets apiVersion and kind in what it writes, not in the object,
// which the informers' caches share.
func TestEncodeLeavesObjectAlone(t *testing.T) {
	objs := []Object{{Pod: SlimPod(fullPod())}, {Service: SlimService(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "n"},
		Spec: corev1.ServiceSpec{ClusterIP: "None", Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}})}}
	for _, o := range objs {
		raw, err := EncodeJSON(o)
		if err != nil {
			t.Fatal(err)
		}
		back, err := DecodeJSON(raw)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		if back.Kind != kindOfObject(o) {
			t.Errorf("%s decoded as a %s", raw, back.Kind)
		}
	}
	if !reflect.DeepEqual(objs[0].Pod, SlimPod(fullPod())) {
		t.Errorf("encoding changed the pod: %+v", objs[0].Pod)
	}
}

func kindOfObject(o Object) Kind {
	if o.Pod != nil {
		return KindPod
	}
	return KindService
}

// podMetaDropped are the metav1.ObjectMeta fields a Pod does not keep
// (nothing reads them).
var podMetaDropped = map[string]bool{"GenerateName": true, "SelfLink": true, "Generation": true,
	"DeletionGracePeriodSeconds": true, "OwnerReferences": true, "Finalizers": true, "ManagedFields": true}

// TestSlimPodMeta: each metav1.ObjectMeta field a Pod keeps has its name
// and type, and SlimPod fills it; a field a k8s.io/apimachinery bump adds
// fails here until it is kept or listed as dropped.
func TestSlimPodMeta(t *testing.T) {
	full := fullPod()
	now := metav1.Now()
	full.CreationTimestamp, full.DeletionTimestamp = now, &now
	p := SlimPod(full)
	pt, mt := reflect.TypeFor[Pod](), reflect.TypeFor[metav1.ObjectMeta]()
	pv, mv := reflect.ValueOf(*p), reflect.ValueOf(full.ObjectMeta)
	for i := range mt.NumField() {
		n := mt.Field(i).Name
		f, kept := pt.FieldByName(n)
		switch {
		case podMetaDropped[n] && kept:
			t.Errorf("Pod keeps %s, listed as dropped", n)
		case podMetaDropped[n]:
		case !kept:
			t.Errorf("metav1.ObjectMeta.%s is neither kept nor among the dropped", n)
		case f.Type != mt.Field(i).Type:
			t.Errorf("Pod.%s is a %s, want %s", n, f.Type, mt.Field(i).Type)
		case mv.FieldByName(n).IsZero():
			t.Errorf("fullPod sets no %s", n)
		case !reflect.DeepEqual(pv.FieldByName(n).Interface(), mv.FieldByName(n).Interface()):
			t.Errorf("SlimPod: %s %v, want %v", n, pv.FieldByName(n), mv.FieldByName(n))
		}
	}
	if !reflect.DeepEqual(p.V1().ObjectMeta, metav1.ObjectMeta{Name: full.Name, Namespace: full.Namespace, ResourceVersion: full.ResourceVersion,
		UID: full.UID, CreationTimestamp: now, DeletionTimestamp: &now, Labels: full.Labels, Annotations: full.Annotations}) {
		t.Errorf("V1 metadata: %+v", p.V1().ObjectMeta)
	}
	var _ metav1.Object = p // the informers' caches key it
	if p.GetUID() != "u-1" || p.GetDeletionTimestamp() != full.DeletionTimestamp || p.GetAnnotations()["kubernetes.io/egress-bandwidth"] != "10M" {
		t.Errorf("metav1.Object getters: uid %q deletion %v annotations %v", p.GetUID(), p.GetDeletionTimestamp(), p.GetAnnotations())
	}
}
