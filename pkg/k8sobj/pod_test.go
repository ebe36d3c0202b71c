package k8sobj

import (
	"errors"
	"strings"
	"testing"
)

func TestDecodeNamespaceAndPod(t *testing.T) {
	objs, err := Decode(mustRead(t, "pods.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 || objs[0].String() != "Namespace shop" || objs[1].String() != "Pod shop/web-1" {
		t.Fatalf("got %v", objs)
	}
	if objs[0].Namespace() != "" || objs[0].Key() != "Namespace//shop" || objs[1].Key() != "Pod/shop/web-1" {
		t.Errorf("keys %q %q", objs[0].Key(), objs[1].Key())
	}
	pod := objs[1].Pod
	if ip, ok := PodIPv4(pod); !ok || ip.String() != "10.244.1.5" {
		t.Errorf("pod IP %v %v", ip, ok)
	}
	if pod.Spec.Containers[0].Ports[1].Name != "dns" || pod.Labels["app"] != "web" {
		t.Errorf("pod decoded wrong: %+v", pod)
	}
	assertRoundTrip(t, objs)
	// A pod without namespace lands in default, like kubectl does.
	objs, err = Decode([]byte("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"))
	if err != nil || objs[0].Pod.Namespace != DefaultNamespace {
		t.Fatalf("default namespace: %v %v", objs, err)
	}
}

func TestDecodePodNamespaceInvalid(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"apiVersion: v1\nkind: Namespace\nmetadata: {name: a, namespace: b}\n", "Namespace a): metadata.namespace: Forbidden"},
		{"apiVersion: v1\nkind: Namespace\nmetadata: {name: A_b}\n", "metadata.name: Invalid value: \"A_b\""},
		{"apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\nspec: {bogus: 1}\n", "unknown field \"spec.bogus\""},
		{"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nstatus: {podIP: 10.0.0.300}\n", "Pod default/p): status.podIP: Invalid value"},
		{"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nstatus: {podIP: 10.0.0.1, podIPs: [{ip: 10.0.0.2}]}\n", "status.podIPs[0].ip: Invalid value: \"10.0.0.2\": must match status.podIP"},
		{"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, ports: [{name: http, containerPort: 80}, {name: http, containerPort: 81}]}]}\n", "spec.containers[0].ports[1].name: Duplicate value: \"http\""},
		{"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, ports: [{name: toolongportname1, containerPort: 80}]}]}\n", "spec.containers[0].ports[0].name: Invalid value"},
		{"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, ports: [{containerPort: 0}]}]}\n", "spec.containers[0].ports[0].containerPort: Invalid value: 0"},
		{"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, ports: [{containerPort: 80, hostPort: 70000}]}]}\n", "spec.containers[0].ports[0].hostPort: Invalid value: 70000"},
		{"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, ports: [{containerPort: 80, hostPort: 8080, hostIP: 'local host'}]}]}\n", "spec.containers[0].ports[0].hostIP: Invalid value"},
		{"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, ports: [{containerPort: 80, protocol: GRE}]}]}\n", "spec.containers[0].ports[0].protocol: Unsupported value"},
		{"apiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {'a b': c}}\n", "metadata.labels[a b]: Invalid value"},
		{"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {nodeName: 'Node_1'}\n", "spec.nodeName: Invalid value"},
		{"apiVersion: v2\nkind: Pod\nmetadata: {name: p}\n", "apiVersion \"v2\" is not supported for Pod"},
	} {
		objs, err := Decode([]byte(tc.doc))
		var de *DocError
		if err == nil || objs != nil || !errors.As(err, &de) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, %v; want error containing %q", tc.doc, objs, err, tc.want)
		}
	}
}

func TestParseKind(t *testing.T) {
	for _, k := range Kinds {
		if got, err := ParseKind(strings.ToLower(string(k))); err != nil || got != k {
			t.Errorf("ParseKind(%s) = %v %v", k, got, err)
		}
	}
	if _, err := ParseKind("Deployment"); err == nil {
		t.Error("ParseKind(Deployment) succeeded")
	}
	if KindNamespace.Namespaced() || !KindPod.Namespaced() {
		t.Error("Namespaced")
	}
}
