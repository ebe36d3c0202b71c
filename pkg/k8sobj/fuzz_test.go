package k8sobj

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzDecode: Decode never panics, and every accepted batch re-encodes and
// round-trips. The seed corpus (testdata files and the invalid-input table
// fragments below) runs under plain `go test`; `go test -fuzz FuzzDecode
// ./pkg/k8sobj` explores further.
func FuzzDecode(f *testing.F) {
	files, _ := filepath.Glob("testdata/*")
	for _, p := range files {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	for _, s := range []string{
		"", "---", "null", "[]", "{}", "{\"kind\":\"List\",\"apiVersion\":\"v1\",\"items\":[null]}",
		svcHead + "spec: {clusterIP: 10.96.0.1, ports: [{port: 80, targetPort: http}]}\n",
		svcHead + "spec: {clusterIP: None}\n",
		sliceHead + "addressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints: [{addresses: [10.0.0.1], conditions: {}}]\n",
		"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, namespace: ns1, uid: u, resourceVersion: '3', " +
			"labels: {kubernetes.io/service-name: web, service.kubernetes.io/headless: '', app: x}, " +
			"annotations: {endpoints.kubernetes.io/last-change-trigger-time: '2026-11-30T07:00:00Z', b: c}, ownerReferences: [{apiVersion: v1, kind: Service, name: web, uid: s}]}\n" +
			"addressType: IPv6\nports: [{name: http, port: 8080, protocol: UDP, appProtocol: h}]\nendpoints: [{addresses: ['fd00::1'], " +
			"conditions: {ready: false, serving: true, terminating: true}, nodeName: node-a, zone: z, hostname: h, deprecatedTopology: {a: b}, " +
			"targetRef: {kind: Pod, namespace: ns2, name: p, uid: u}, hints: {forZones: [{name: z}], forNodes: [{name: node-a}]}}, {addresses: ['fd00::2'], targetRef: {kind: Node, name: node-a}}]\n",
		npHead + "spec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}}], ports: [{port: 80, endPort: 90}]}]}\n",
		npHead + "spec: {podSelector: {matchExpressions: [{key: a, operator: Exists}]}, egress: [{}]}\n",
		"apiVersion: v1\nkind: Service\nmetadata: {name: a, creationTimestamp: '2020-01-01T00:00:00.5Z'}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 1}]}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := Decode(data)
		if err != nil {
			if objs != nil {
				t.Fatalf("objects returned with error %v", err)
			}
			return
		}
		assertRoundTrip(t, objs)
	})
}
