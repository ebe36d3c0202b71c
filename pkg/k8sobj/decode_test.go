package k8sobj

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"
)

func mustRead(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeValid(t *testing.T) {
	objs, err := Decode(mustRead(t, "valid.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 3 {
		t.Fatalf("got %d objects, want 3", len(objs))
	}
	want := []struct {
		idx  int
		desc string
	}{{0, "Service shop/web"}, {1, "EndpointSlice shop/web-abc"}, {2, "NetworkPolicy shop/allow-front"}}
	for i, w := range want {
		if objs[i].Index != w.idx || objs[i].String() != w.desc {
			t.Errorf("object %d = %d %q, want %d %q", i, objs[i].Index, objs[i], w.idx, w.desc)
		}
	}
	svc := objs[0].Service
	if svc.Spec.Ports[0].TargetPort.StrVal != "http" || svc.Spec.Ports[1].NodePort != 30053 {
		t.Errorf("service ports decoded wrong: %+v", svc.Spec.Ports)
	}
	svcs, slices, pols := Split(objs)
	if len(svcs) != 1 || len(slices) != 1 || len(pols) != 1 || pols[0] != objs[2].NetworkPolicy {
		t.Errorf("Split: %d %d %d", len(svcs), len(slices), len(pols))
	}
	np := objs[2].NetworkPolicy
	if np.Spec.Ingress[0].Ports[1].EndPort == nil || *np.Spec.Ingress[0].Ports[1].EndPort != 2000 {
		t.Errorf("endPort not decoded: %+v", np.Spec.Ingress[0].Ports[1])
	}
}

func TestDecodeJSONStreamAndList(t *testing.T) {
	objs, err := Decode(mustRead(t, "list.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 || objs[0].String() != "NetworkPolicy default/deny-all" || objs[1].String() != "Service x/db" {
		t.Fatalf("got %v", objs)
	}
	if objs[0].Index != 0 || objs[1].Index != 1 {
		t.Errorf("indexes %d %d, want 0 1", objs[0].Index, objs[1].Index)
	}
}

func TestDecodeEmpty(t *testing.T) {
	for _, in := range []string{"", "---\n", "# only a comment\n---\n# another\n", "\n\n"} {
		objs, err := Decode([]byte(in))
		if err != nil || len(objs) != 0 {
			t.Errorf("Decode(%q) = %v, %v; want nothing", in, objs, err)
		}
	}
}

const svcHead = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns1}\n"
const sliceHead = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, namespace: ns1, labels: {kubernetes.io/service-name: web}}\n"
const npHead = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: ns1}\n"

// TestDecodeInvalid: every invalid input is rejected with an error naming the
// document, the object and the field.
func TestDecodeInvalid(t *testing.T) {
	good := svcHead + "spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n"
	tests := []struct {
		name string
		in   string
		want []string // substrings of the error
	}{
		{"unknown top field", svcHead + "spek: {}\n", []string{"document 0", "Service ns1/web", `unknown field "spek"`}},
		{"unknown nested field", svcHead + "spec: {clusterIP: 10.96.0.1, ports: [{port: 80, prot: TCP}]}\n",
			[]string{`unknown field "spec.ports[0].prot"`}},
		{"duplicate field", svcHead + "spec: {clusterIP: 10.96.0.1, clusterIP: 10.96.0.2, ports: [{port: 80}]}\n", []string{"document 0", "already set"}},
		{"second document bad", good + "---\n" + svcHead + "spec: {clusterIP: 10.96.0.1, ports: [{port: 0}]}\n",
			[]string{"document 1", "spec.ports[0].port", "between 1 and 65535"}},
		{"port too large", svcHead + "spec: {clusterIP: 10.96.0.1, ports: [{port: 65536}]}\n", []string{"spec.ports[0].port"}},
		{"bogus protocol", svcHead + "spec: {clusterIP: 10.96.0.1, ports: [{port: 80, protocol: ICMP}]}\n", []string{"spec.ports[0].protocol", "Unsupported value"}},
		{"target port name", svcHead + "spec: {clusterIP: 10.96.0.1, ports: [{port: 80, targetPort: Not_A_Name}]}\n", []string{"spec.ports[0].targetPort"}},
		{"target port number", svcHead + "spec: {clusterIP: 10.96.0.1, ports: [{port: 80, targetPort: 70000}]}\n", []string{"spec.ports[0].targetPort"}},
		{"no cluster ip", svcHead + "spec: {ports: [{port: 80}]}\n", []string{"spec.clusterIP", "Required"}},
		{"bad cluster ip", svcHead + "spec: {clusterIP: 300.1.1.1, ports: [{port: 80}]}\n", []string{"spec.clusterIP"}},
		{"unnamed multi ports", svcHead + "spec: {clusterIP: 10.96.0.1, ports: [{port: 80}, {port: 81}]}\n", []string{"spec.ports[0].name"}},
		{"dup port", svcHead + "spec: {clusterIP: 10.96.0.1, ports: [{name: a, port: 80}, {name: b, port: 80}]}\n", []string{"spec.ports[1]", "Duplicate"}},
		{"nodeport on clusterip", svcHead + "spec: {clusterIP: 10.96.0.1, ports: [{port: 80, nodePort: 30000}]}\n", []string{"spec.ports[0].nodePort", "Forbidden"}},
		{"nodeport missing", svcHead + "spec: {type: NodePort, clusterIP: 10.96.0.1, ports: [{port: 80}]}\n", []string{"spec.ports[0].nodePort", "Required"}},
		{"externalname bad name", svcHead + "spec: {type: ExternalName, externalName: 'not a name', ports: [{port: 80}]}\n", []string{"spec.externalName"}},
		{"externalname no name", svcHead + "spec: {type: ExternalName}\n", []string{"spec.externalName", "Required"}},
		{"externalname with cluster ip", svcHead + "spec: {type: ExternalName, externalName: x.example, clusterIP: 10.96.0.1}\n", []string{"spec.clusterIPs", "ExternalName"}},
		{"unknown type", svcHead + "spec: {type: Magic, clusterIP: 10.96.0.1, ports: [{port: 80}]}\n", []string{"spec.type", "Unsupported"}},
		{"name not dns-1035", "apiVersion: v1\nkind: Service\nmetadata: {name: 1web, namespace: ns1}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n",
			[]string{"metadata.name", "1web", "DNS-1035"}},
		{"second clusterIP beside an invalid first", "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns1}\nspec: {clusterIP: 10.96.0.300, clusterIPs: [10.96.0.300, 'fd00::1'], ports: [{port: 80}]}\n",
			[]string{"spec.clusterIPs[0]"}},
		{"name with dot", "apiVersion: v1\nkind: Service\nmetadata: {name: web.v1, namespace: ns1}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n",
			[]string{"metadata.name", "DNS-1035"}},
		{"headless nodeport", svcHead + "spec: {type: NodePort, clusterIP: None, ports: [{port: 80, nodePort: 30000}]}\n", []string{"spec.clusterIP", "may not be set to 'None'"}},
		{"etp on clusterip", svcHead + "spec: {clusterIP: 10.96.0.1, externalTrafficPolicy: Local, ports: [{port: 80}]}\n",
			[]string{"spec.externalTrafficPolicy", "externally-accessible"}},
		{"etp bogus", svcHead + "spec: {type: NodePort, clusterIP: 10.96.0.1, externalTrafficPolicy: Nearby, ports: [{port: 80, nodePort: 30000}]}\n",
			[]string{"spec.externalTrafficPolicy", "Unsupported"}},
		{"itp bogus", svcHead + "spec: {clusterIP: 10.96.0.1, internalTrafficPolicy: Nearby, ports: [{port: 80}]}\n", []string{"spec.internalTrafficPolicy", "Unsupported"}},
		{"health check on cluster etp", svcHead + "spec: {type: LoadBalancer, clusterIP: 10.96.0.1, externalTrafficPolicy: Cluster, healthCheckNodePort: 31000, ports: [{port: 80, nodePort: 30000}]}\n",
			[]string{"spec.healthCheckNodePort", "'LoadBalancer' and `externalTrafficPolicy` is 'Local'"}},
		{"external ip bad", svcHead + "spec: {clusterIP: 10.96.0.1, externalIPs: [1.2.3], ports: [{port: 80}]}\n", []string{"spec.externalIPs[0]"}},
		{"external ip loopback", svcHead + "spec: {clusterIP: 10.96.0.1, externalIPs: [127.0.0.5], ports: [{port: 80}]}\n", []string{"spec.externalIPs[0]", "loopback"}},
		{"external ip v4-mapped", svcHead + "spec: {clusterIP: 10.96.0.1, externalIPs: ['::ffff:10.0.0.1'], ports: [{port: 80}]}\n", []string{"spec.externalIPs[0]", "IPv4-mapped"}},
		{"source range not a cidr", svcHead + "spec: {type: LoadBalancer, clusterIP: 10.96.0.1, loadBalancerSourceRanges: [10.0.0.0/8, 10.1.0.0/33], ports: [{port: 80, nodePort: 30000}]}\n",
			[]string{"spec.loadBalancerSourceRanges[1]", "10.1.0.0/33", "valid CIDR"}},
		{"source range v4-mapped", svcHead + "spec: {type: LoadBalancer, clusterIP: 10.96.0.1, loadBalancerSourceRanges: ['::ffff:10.0.0.0/104'], ports: [{port: 80, nodePort: 30000}]}\n",
			[]string{"spec.loadBalancerSourceRanges[0]", "IPv4-mapped"}},
		{"source ranges on clusterip", svcHead + "spec: {clusterIP: 10.96.0.1, loadBalancerSourceRanges: [10.0.0.0/8], ports: [{port: 80}]}\n",
			[]string{"spec.loadBalancerSourceRanges", "Forbidden", "'LoadBalancer'"}},
		{"source range annotation not a cidr", "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns1, annotations: {service.beta.kubernetes.io/load-balancer-source-ranges: '10.0.0.0/8,,'}}\n" +
			"spec: {type: LoadBalancer, clusterIP: 10.96.0.1, ports: [{port: 80, nodePort: 30000}]}\n",
			[]string{"metadata.annotations[service.beta.kubernetes.io/load-balancer-source-ranges]", "valid CIDR"}},
		{"source range annotation on clusterip", "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns1, annotations: {service.beta.kubernetes.io/load-balancer-source-ranges: '10.0.0.0/8'}}\n" +
			"spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n",
			[]string{"load-balancer-source-ranges", "Forbidden"}},
		{"dual stack required, one cluster IP", svcHead + "spec: {clusterIP: 10.96.0.1, ipFamilyPolicy: RequireDualStack, ports: [{port: 80}]}\n", []string{"spec.ipFamilyPolicy", "both families"}},
		{"unknown family", svcHead + "spec: {clusterIP: 10.96.0.1, ipFamilies: [IPv7], ports: [{port: 80}]}\n", []string{"spec.ipFamilies[0]", "Unsupported"}},
		{"lb ingress on clusterip", svcHead + "spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\nstatus: {loadBalancer: {ingress: [{ip: 192.0.2.1}]}}\n",
			[]string{"status.loadBalancer.ingress", "'LoadBalancer'"}},
		{"lb ingress v4-mapped", svcHead + "spec: {type: LoadBalancer, clusterIP: 10.96.0.1, ports: [{port: 80, nodePort: 30000}]}\nstatus: {loadBalancer: {ingress: [{ip: '::ffff:10.0.0.2'}]}}\n",
			[]string{"status.loadBalancer.ingress[0].ip", "IPv4-mapped"}},
		{"lb ingress ipmode without ip", svcHead + "spec: {type: LoadBalancer, clusterIP: 10.96.0.1, ports: [{port: 80, nodePort: 30000}]}\nstatus: {loadBalancer: {ingress: [{hostname: a.example, ipMode: VIP}]}}\n",
			[]string{"status.loadBalancer.ingress[0].ip", "Required"}},
		{"affinity timeout zero", svcHead + "spec: {clusterIP: 10.96.0.1, ports: [{port: 80}], sessionAffinity: ClientIP, sessionAffinityConfig: {clientIP: {timeoutSeconds: 0}}}\n",
			[]string{"spec.sessionAffinityConfig.clientIP.timeoutSeconds"}},
		{"affinity timeout big", svcHead + "spec: {clusterIP: 10.96.0.1, ports: [{port: 80}], sessionAffinity: ClientIP, sessionAffinityConfig: {clientIP: {timeoutSeconds: 86401}}}\n",
			[]string{"spec.sessionAffinityConfig.clientIP.timeoutSeconds"}},
		{"affinity config without clientip", svcHead + "spec: {clusterIP: 10.96.0.1, ports: [{port: 80}], sessionAffinityConfig: {clientIP: {timeoutSeconds: 5}}}\n",
			[]string{"spec.sessionAffinityConfig"}},
		{"unsupported kind", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: p}\n", []string{"document 0", "Deployment default/p", `kind "Deployment" is not supported`}},
		{"wrong apiVersion", "apiVersion: networking.k8s.io/v1beta1\nkind: NetworkPolicy\nmetadata: {name: p}\nspec: {podSelector: {}}\n", []string{"apiVersion"}},
		{"missing kind", "apiVersion: v1\nmetadata: {name: p}\n", []string{"kind: Required"}},
		{"no name", "apiVersion: v1\nkind: Service\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n", []string{"metadata.name"}},
		{"not yaml", "{{{", []string{"document 0"}},
		{"scalar doc", "hello\n", []string{"document 0"}},
		{"duplicate object", good + "---\n" + good, []string{"document 1", "duplicate of document 0"}},
		{"slice no service label", "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s}\naddressType: IPv4\n",
			[]string{"kubernetes.io/service-name"}},
		{"slice fqdn", sliceHead + "addressType: FQDN\n", []string{"addressType", "Unsupported"}},
		{"slice ipv6 with an ipv4 address", sliceHead + "addressType: IPv6\nendpoints: [{addresses: [10.0.0.1]}]\n", []string{"endpoints[0].addresses[0]", "IPv6 address"}},
		{"slice bad address", sliceHead + "addressType: IPv4\nendpoints: [{addresses: [10.0.0.300]}]\n", []string{"endpoints[0].addresses[0]"}},
		{"slice port missing", sliceHead + "addressType: IPv4\nports: [{name: http}]\n", []string{"ports[0].port", "Required"}},
		{"slice bogus protocol", sliceHead + "addressType: IPv4\nports: [{port: 1, protocol: sctp}]\n", []string{"ports[0].protocol", "Unsupported value"}},
		{"slice unknown field", sliceHead + "addressType: IPv4\nendpoints: [{addresses: [10.0.0.1], conditions: {ready: true, happy: true}}]\n",
			[]string{`unknown field "endpoints[0].conditions.happy"`}},
		{"np bad selector op", npHead + "spec: {podSelector: {matchExpressions: [{key: a, operator: Near}]}}\n", []string{"spec.podSelector"}},
		{"np selector In without values", npHead + "spec: {podSelector: {matchExpressions: [{key: a, operator: In}]}}\n", []string{"spec.podSelector"}},
		{"np bad label value", npHead + "spec: {podSelector: {matchLabels: {a: 'no spaces'}}}\n", []string{"spec.podSelector"}},
		{"np bad ns selector", npHead + "spec: {podSelector: {}, ingress: [{from: [{namespaceSelector: {matchLabels: {'bad key!': x}}}]}]}\n",
			[]string{"spec.ingress[0].from[0].namespaceSelector"}},
		{"np empty peer", npHead + "spec: {podSelector: {}, ingress: [{from: [{}]}]}\n", []string{"spec.ingress[0].from[0]", "must specify a peer"}},
		{"np ipblock with selector", npHead + "spec: {podSelector: {}, egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8}, podSelector: {}}]}]}\n",
			[]string{"spec.egress[0].to[0]", "ipBlock may not be combined"}},
		{"np bad cidr", npHead + "spec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/33}}]}]}\n", []string{"spec.ingress[0].from[0].ipBlock.cidr"}},
		{"np except outside", npHead + "spec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: [11.0.0.0/16]}}]}]}\n",
			[]string{"spec.ingress[0].from[0].ipBlock.except[0]", "strictly within"}},
		{"np except equal", npHead + "spec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.0.0.0/8]}}]}]}\n",
			[]string{"ipBlock.except[0]"}},
		{"np endPort with name", npHead + "spec: {podSelector: {}, ingress: [{ports: [{port: http, endPort: 90}]}]}\n", []string{"spec.ingress[0].ports[0].endPort", "named port"}},
		{"np endPort below port", npHead + "spec: {podSelector: {}, ingress: [{ports: [{port: 90, endPort: 80}]}]}\n", []string{"spec.ingress[0].ports[0].endPort"}},
		{"np endPort without port", npHead + "spec: {podSelector: {}, ingress: [{ports: [{endPort: 80}]}]}\n", []string{"spec.ingress[0].ports[0].port"}},
		{"np endPort too big", npHead + "spec: {podSelector: {}, ingress: [{ports: [{port: 80, endPort: 65536}]}]}\n", []string{"spec.ingress[0].ports[0].endPort"}},
		{"np port zero", npHead + "spec: {podSelector: {}, ingress: [{ports: [{port: 0}]}]}\n", []string{"spec.ingress[0].ports[0].port"}},
		{"np bogus protocol", npHead + "spec: {podSelector: {}, egress: [{ports: [{protocol: ICMP, port: 5}]}]}\n", []string{"spec.egress[0].ports[0].protocol", "Unsupported value"}},
		{"np bad policy type", npHead + "spec: {podSelector: {}, policyTypes: [Sideways]}\n", []string{"spec.policyTypes[0]"}},
		{"np dup policy type", npHead + "spec: {podSelector: {}, policyTypes: [Ingress, Ingress]}\n", []string{"spec.policyTypes[1]"}},
		{"list with bad item", `{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"},"spec":{"clusterIP":"10.96.0.1","ports":[{"port":-1}]}}]}`,
			[]string{"document 0", "List item 0", "spec.ports[0].port"}},
		{"bad json stream", `{"apiVersion":"v1"} {`, []string{"document 1", "parse json"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := Decode([]byte(tt.in))
			if err == nil {
				t.Fatalf("accepted: %+v", objs)
			}
			if objs != nil {
				t.Errorf("returned objects with an error: %v", objs)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestAllOrNothing: one bad document among good ones rejects everything.
func TestAllOrNothing(t *testing.T) {
	good := mustRead(t, "valid.yaml")
	bad := append(append([]byte{}, good...), []byte("---\n"+npHead+"spec: {podSelector: {}, ingress: [{ports: [{port: 99999}]}]}\n")...)
	objs, err := Decode(bad)
	if err == nil || objs != nil {
		t.Fatalf("got %v, %v; want an error and nothing", objs, err)
	}
	var de *DocError
	if !errors.As(err, &de) || de.Index != 3 || de.Object != "NetworkPolicy ns1/p" {
		t.Fatalf("error %v: want DocError for document 3 NetworkPolicy ns1/p", err)
	}
}

func TestEncodeRoundTrip(t *testing.T) {
	for _, f := range []string{"valid.yaml", "list.json"} {
		objs, err := Decode(mustRead(t, f))
		if err != nil {
			t.Fatal(err)
		}
		assertRoundTrip(t, objs)
	}
}

// assertRoundTrip: an accepted batch encodes, decodes again to the same number
// of objects, and re-encodes to identical bytes.
func assertRoundTrip(t *testing.T, objs []Object) {
	t.Helper()
	b1, err := Encode(objs)
	if err != nil {
		t.Fatalf("encode accepted batch: %v", err)
	}
	objs2, err := Decode(b1)
	if err != nil {
		t.Fatalf("re-decode of encoded batch: %v\n%s", err, b1)
	}
	if len(objs2) != len(objs) {
		t.Fatalf("round trip: %d objects, want %d", len(objs2), len(objs))
	}
	for i := range objs {
		if objs[i].String() != objs2[i].String() {
			t.Fatalf("round trip object %d: %s, want %s", i, objs2[i], objs[i])
		}
	}
	b2, err := Encode(objs2)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b1, b2) {
		t.Fatalf("encoding not stable:\n%s\n---- vs ----\n%s", b1, b2)
	}
}

// TestDecodeKeepsSCTP: objects listing an SCTP port are kept whole (a
// NetworkPolicy refused for its SCTP rule would leave its pods unisolated;
// a Service's TCP and UDP ports are served beside it).
func TestDecodeKeepsSCTP(t *testing.T) {
	for _, doc := range []string{
		"apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns1}\nspec: {clusterIP: 10.96.0.1, ports: [{name: a, port: 80, protocol: SCTP}, {name: b, port: 80}]}\n",
		"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, namespace: ns1, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{port: 1, protocol: SCTP}]\n",
		"apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: ns1}\nspec: {podSelector: {}, egress: [{ports: [{protocol: SCTP, port: 5}]}]}\n",
		"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, ports: [{containerPort: 80, hostPort: 80, protocol: SCTP}]}]}\n",
	} {
		if objs, err := Decode([]byte(doc)); err != nil || len(objs) != 1 {
			t.Errorf("%q: got %v, %v; want it kept", doc, objs, err)
		}
	}
}
