package k8sobj

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// fullSlice is a slice as the endpointslice controller writes it: what
// lanekit reads and much it does not.
func fullSlice() *discoveryv1.EndpointSlice {
	created := metav1.Date(2026, 11, 30, 7, 0, 0, 0, time.UTC)
	return &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{Name: "web-abc12", GenerateName: "web-", Namespace: "shop", UID: "u-1", ResourceVersion: "42",
			Generation: 3, CreationTimestamp: created,
			Labels: map[string]string{discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io",
				"app.kubernetes.io/name": "web", corev1.IsHeadlessService: ""},
			Annotations:     map[string]string{corev1.EndpointsLastChangeTriggerTime: "2026-11-30T07:00:00.123456789Z", "example.com/note": "n"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "web", UID: "svc-1", Controller: ptr.To(true)}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager"}}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.1.5"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
				Hostname: ptr.To("web-0"), NodeName: ptr.To("node-1"), Zone: ptr.To("z1"),
				TargetRef:          &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: "web-0", UID: "pod-1", ResourceVersion: "7"},
				DeprecatedTopology: map[string]string{"kubernetes.io/hostname": "node-1"},
				Hints:              &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}, ForNodes: []discoveryv1.ForNode{{Name: "node-1"}}}},
			{Addresses: []string{"10.244.2.6"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)},
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "web-1"}},
			{Addresses: []string{"10.244.3.7"}, TargetRef: &corev1.ObjectReference{Kind: "Node", Name: "node-3"}},
		},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080), AppProtocol: ptr.To("http")}},
	}
}

// TestSlimEndpointSlice: an EndpointSlice keeps every field lanekit reads
// of a v1 EndpointSlice — the Service it names, the headless mark, the
// trigger time (network programming latency), the address type, ports and
// each endpoint's addresses, conditions, hints and pod — and none of the
// rest. Drop one of them from SlimEndpointSlice and this fails.
func TestSlimEndpointSlice(t *testing.T) {
	full := fullSlice()
	es := SlimEndpointSlice(full)
	want := &EndpointSlice{
		Name: "web-abc12", Namespace: "shop", ResourceVersion: "42", CreationTimestamp: full.CreationTimestamp,
		ServiceName: "web", Headless: true, TriggerTime: "2026-11-30T07:00:00.123456789Z",
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []Endpoint{
			{Addresses: []string{"10.244.1.5"}, Conditions: EndpointConditions{ConditionTrue, ConditionTrue, ConditionFalse},
				Hints:     &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}, ForNodes: []discoveryv1.ForNode{{Name: "node-1"}}},
				TargetRef: &PodRef{Namespace: "shop", Name: "web-0"}},
			{Addresses: []string{"10.244.2.6"}, Conditions: EndpointConditions{ConditionFalse, ConditionTrue, ConditionTrue},
				TargetRef: &PodRef{Name: "web-1"}},
			{Addresses: []string{"10.244.3.7"}}, // not a pod
		},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080), AppProtocol: ptr.To("http")}},
	}
	if !reflect.DeepEqual(es, want) {
		t.Errorf("SlimEndpointSlice:\n got %+v\nwant %+v", es, want)
	}
	if err := Validate(Object{EndpointSlice: es}); err != nil {
		t.Errorf("the slim slice of a valid slice is refused: %v", err)
	}
	// The whole of what is kept of an endpoint is a third of a v1
	// Endpoint, which then points at its conditions, node, zone,
	// hostname and object reference.
	if sz, v1 := unsafe.Sizeof(Endpoint{}), unsafe.Sizeof(discoveryv1.Endpoint{}); sz > 48 {
		t.Errorf("an Endpoint is %d bytes, want <= 48 (a discoveryv1.Endpoint is %d)", sz, v1)
	}
	// And its metadata is what is read of it, not a metav1.ObjectMeta.
	if sz, v1 := unsafe.Sizeof(EndpointSlice{}), unsafe.Sizeof(discoveryv1.EndpointSlice{}); sz > 192 {
		t.Errorf("an EndpointSlice is %d bytes, want <= 192 (a discoveryv1.EndpointSlice is %d)", sz, v1)
	}

	// It holds none of the decoded object's small allocations (they would
	// keep the heap's spans they sit in): its strings and ports are its own.
	for _, pair := range [][2]string{{es.Name, full.Name}, {es.ResourceVersion, full.ResourceVersion},
		{es.TriggerTime, full.Annotations[corev1.EndpointsLastChangeTriggerTime]},
		{es.Endpoints[0].Addresses[0], full.Endpoints[0].Addresses[0]}, {es.Endpoints[1].TargetRef.Name, full.Endpoints[1].TargetRef.Name}} {
		if unsafe.StringData(pair[0]) == unsafe.StringData(pair[1]) {
			t.Errorf("%q is the decoded object's string", pair[0])
		}
	}
	if &es.Endpoints[0].Addresses[0] == &full.Endpoints[0].Addresses[0] || es.Ports[0].Port == full.Ports[0].Port || es.Ports[0].Name == full.Ports[0].Name {
		t.Error("the addresses or ports are the decoded object's")
	}

	// Encoded, it is a v1 EndpointSlice with what was kept; decoded (as
	// the store reads it back), the same slice.
	v1 := es.V1()
	if v1.Labels[discoveryv1.LabelServiceName] != "web" || len(v1.Labels) != 2 || v1.Annotations[corev1.EndpointsLastChangeTriggerTime] != es.TriggerTime ||
		*v1.Endpoints[1].Conditions.Ready || v1.Endpoints[0].TargetRef.Name != "web-0" || v1.Endpoints[2].Conditions.Ready != nil {
		t.Errorf("V1: %+v", v1)
	}
	if back := SlimEndpointSlice(v1); !reflect.DeepEqual(back, es) {
		t.Errorf("SlimEndpointSlice(V1()):\n got %+v\nwant %+v", back, es)
	}
	raw, err := EncodeJSON(Object{EndpointSlice: es})
	if err != nil {
		t.Fatal(err)
	}
	o, err := DecodeJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	if !sameSlice(o.EndpointSlice, es) {
		t.Errorf("encoded and decoded:\n got %+v\nwant %+v\n%s", o.EndpointSlice, es, raw)
	}
	if js, err := json.Marshal(es); err != nil || string(js) != string(raw) {
		t.Errorf("json.Marshal of the slice is not its v1 encoding: %s, %v", js, err)
	}
	var u EndpointSlice
	if err := json.Unmarshal(raw, &u); err != nil || !sameSlice(&u, es) {
		t.Errorf("json.Unmarshal: %+v, %v", u, err)
	}

	// The informers' caches key it by its metav1.Object; its labels and
	// annotations are those it keeps.
	m, err := meta.Accessor(es)
	if err != nil || m.GetNamespace() != "shop" || m.GetName() != "web-abc12" || m.GetResourceVersion() != "42" ||
		!reflect.DeepEqual(m.GetLabels(), v1.Labels) || !reflect.DeepEqual(m.GetAnnotations(), v1.Annotations) ||
		es.GetObjectKind().GroupVersionKind().String() != "discovery.k8s.io/v1, Kind=EndpointSlice" {
		t.Errorf("metav1.Object: %v %v", m, err)
	}

	// A copy shares nothing: changing it leaves the slice alone.
	c := es.DeepCopy()
	if !reflect.DeepEqual(c, es) {
		t.Fatalf("DeepCopy: %+v, want %+v", c, es)
	}
	c.Endpoints[0].Addresses[0], c.Endpoints[0].TargetRef.Name = "10.0.0.1", "x"
	c.Endpoints[0].Hints.ForZones[0].Name = "z9"
	*c.Ports[0].Port = 1
	if es.Endpoints[0].Addresses[0] != "10.244.1.5" || es.Endpoints[0].TargetRef.Name != "web-0" ||
		es.Endpoints[0].Hints.ForZones[0].Name != "z1" || *es.Ports[0].Port != 8080 {
		t.Errorf("the copy shares with the slice: %+v", es)
	}
}

// TestRestoreStoredFullSlice: an agent before the slim type stored each
// slice whole, as discoveryv1 JSON (owner references, managed-by label,
// node names, object references with UIDs...): read back from the store,
// it is the slice the informers' transform would have made of it.
func TestRestoreStoredFullSlice(t *testing.T) {
	full := fullSlice()
	full.ManagedFields = nil // the old agent's transform dropped them
	raw, err := json.Marshal(full)
	if err != nil {
		t.Fatal(err)
	}
	o, err := DecodeJSON(raw)
	if err != nil {
		t.Fatalf("a stored full slice does not restore: %v\n%s", err, raw)
	}
	if want := SlimEndpointSlice(full); o.Kind != KindEndpointSlice || !sameSlice(o.EndpointSlice, want) {
		t.Errorf("restored:\n got %+v\nwant %+v", o.EndpointSlice, want)
	}
}

// TestSlimSliceStillRefused: what Validate refused of a v1 slice it still
// refuses of the slim one — among them a label lanekit does not read, which
// the slim slice keeps only to be refused for it.
func TestSlimSliceStillRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*discoveryv1.EndpointSlice)
		want string
	}{
		{"invalid label key", func(es *discoveryv1.EndpointSlice) { es.Labels["bad key!"] = "x" }, "metadata.labels[bad key!]"},
		{"invalid label value", func(es *discoveryv1.EndpointSlice) { es.Labels["app"] = "no spaces" }, "metadata.labels[app]"},
		{"invalid service name", func(es *discoveryv1.EndpointSlice) { es.Labels[discoveryv1.LabelServiceName] = "web!" },
			"metadata.labels[kubernetes.io/service-name]"},
		{"no service name", func(es *discoveryv1.EndpointSlice) { delete(es.Labels, discoveryv1.LabelServiceName) }, "kubernetes.io/service-name"},
		{"invalid name", func(es *discoveryv1.EndpointSlice) { es.Name = "Web" }, "metadata.name"},
		{"invalid address", func(es *discoveryv1.EndpointSlice) { es.Endpoints[1].Addresses[0] = "10.0.0.300" }, "endpoints[1].addresses[0]"},
		{"no address", func(es *discoveryv1.EndpointSlice) { es.Endpoints[2].Addresses = nil }, "endpoints[2].addresses"},
		{"FQDN", func(es *discoveryv1.EndpointSlice) { es.AddressType = discoveryv1.AddressTypeFQDN }, "addressType"},
		{"port without number", func(es *discoveryv1.EndpointSlice) { es.Ports[0].Port = nil }, "ports[0].port"},
		{"invalid protocol", func(es *discoveryv1.EndpointSlice) { es.Ports[0].Protocol = ptr.To(corev1.Protocol("tcp")) }, "ports[0].protocol"},
	} {
		es := fullSlice()
		c.edit(es)
		err := Validate(Object{EndpointSlice: SlimEndpointSlice(es)})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %s", c.name, err, c.want)
		}
		// The same through Decode, as a file or the store reads it.
		raw, jerr := json.Marshal(es)
		if jerr != nil {
			t.Fatal(jerr)
		}
		if _, err := DecodeJSON(raw); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: DecodeJSON: %v, want an error naming %s", c.name, err, c.want)
		}
	}
	// A slim slice built in code is checked too.
	es := SlimEndpointSlice(fullSlice())
	es.ServiceName = "web!"
	if err := Validate(Object{EndpointSlice: es}); err == nil || !strings.Contains(err.Error(), discoveryv1.LabelServiceName) {
		t.Errorf("an invalid ServiceName: %v", err)
	}
}

// sameSlice is reflect.DeepEqual but for the creation time's location (a
// decoded time is local).
func sameSlice(a, b *EndpointSlice) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return false
	}
	x, y := *a, *b
	x.CreationTimestamp, y.CreationTimestamp = metav1.Time{}, metav1.Time{}
	return reflect.DeepEqual(&x, &y)
}
