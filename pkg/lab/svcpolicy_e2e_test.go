package lab

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/internal/policymodel"
)

// TestLabServicesPolicyE2E is issue 12's end-to-end suite on one 2-node lab
// (brought up once; each part uses its own Kubernetes namespaces):
//
//   - policy-truth-table: 3 namespaces × 3 pods over 2 nodes plus 2
//     cluster-external hosts, ports 80/81 × TCP/UDP, every cell checked by
//     real traffic against an independent model of NetworkPolicy, and every
//     denied cell accounted for in the policy drop counters of the node and
//     endpoint that must drop it;
//   - services: spread over backends from clients on both nodes (TCP and
//     UDP), backend removal moves only that backend's flows (held
//     connections keep their backend), NodePort from the other node and from
//     an external host;
//   - invalid-objects: bad and fuzzed object files through the CLI and the
//     API change nothing (lists, stored objects, BPF map entry counts) and
//     the agents stay up.
//
// Run it under `flock /tmp/lanekit-lab.lock` (the lab is global). Root only.
func TestLabServicesPolicyE2E(t *testing.T) {
	lk, _ := upLabCLI(t)
	cp := agentStatus(t, 1).GetControlPlane()
	if !cp.GetServiceDatapath() || !cp.GetPolicyDatapath() {
		t.Skipf("the datapath lacks services (%v) or policy (%v)", cp.GetServiceDatapath(), cp.GetPolicyDatapath())
	}
	t.Run("policy-truth-table", func(t *testing.T) { policyTruthTable(t, lk) })
	t.Run("services", func(t *testing.T) { servicesE2E(t, lk) })
	t.Run("invalid-objects", func(t *testing.T) { invalidObjectsE2E(t, lk) })
	for node := 1; node <= 2; node++ {
		if st := agentStatus(t, node); !st.GetReady() {
			t.Errorf("agent on node %d not ready at the end: %s", node, st.GetReason())
		}
	}
}

// routeRawHosts gives the lab's raw hosts (cluster-external machines on the
// underlay) routes to the nodes' pod ranges, as a router would.
func routeRawHosts(t *testing.T) {
	t.Helper()
	if routedLab() {
		t.Log("routed underlay (tunnel mode): nothing off the nodes routes pod CIDRs; external hosts reach pods through NodePorts only")
		return
	}
	for r := 1; r <= RawHosts; r++ {
		for n := 1; n <= 2; n++ {
			if err := ip(context.Background(), "-n", RawNS(r), "route", "replace", PodCIDR(n), "via", UnderlayIP(n)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// The truth table's policies: every NetworkPolicy field lanekit supports.
//
//	alpha (team=alpha, env=prod)  web: ingress only (default policyTypes):
//	    same-namespace clients on the named port "svc" (TCP) or "alt" (UDP);
//	    any pod of env=dev namespaces on UDP 80-81 (endPort);
//	    the underlay /24 except raw host 2 on TCP 81 (ipBlock + except).
//	  db: egress only: web/db pods (matchExpressions) of team=beta namespaces
//	    (namespaceSelector AND podSelector) on all UDP ports (protocol, no
//	    port); the raw-host /29 except raw host 1, every port.
//	beta (team=beta, env=prod)  every pod: ingress default deny;
//	  web: from every pod of every namespace (namespaceSelector {}) on "svc"
//	    and UDP 81; tier=back: TCP 80-81 from alpha clients or any beta pod;
//	  clients: ingress+egress isolated: egress to their namespace (any
//	    port) and to non-prod namespaces (NotIn) on TCP 81.
//	gamma (env=dev)  only db: egress deny-all (policyTypes [Egress], no
//	    rules): what reaches it must still be answered (replies pass).
//	  ipBlocks that cover pods (truthIPBlockPolicies, templated with the
//	  pods' addresses): see there.
const truthPolicies = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-in, namespace: alpha}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
    ports: [{port: svc}, {protocol: UDP, port: alt}]
  - from: [{namespaceSelector: {matchLabels: {env: dev}}}]
    ports: [{protocol: UDP, port: 80, endPort: 81}]
  - from: [{ipBlock: {cidr: 10.77.0.0/24, except: [10.77.0.252/32]}}]
    ports: [{protocol: TCP, port: 81}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db-out, namespace: alpha}
spec:
  podSelector: {matchLabels: {app: db}}
  policyTypes: [Egress]
  egress:
  - to:
    - namespaceSelector: {matchLabels: {team: beta}}
      podSelector: {matchExpressions: [{key: app, operator: In, values: [web, db]}]}
    ports: [{protocol: UDP}]
  - to: [{ipBlock: {cidr: 10.77.0.248/29, except: [10.77.0.251/32]}}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-in, namespace: beta}
spec:
  podSelector: {}
  policyTypes: [Ingress]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-any, namespace: beta}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{namespaceSelector: {}}]
    ports: [{port: svc}, {protocol: UDP, port: 81}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: back-in, namespace: beta}
spec:
  podSelector: {matchLabels: {tier: back}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {team: alpha}}
      podSelector: {matchLabels: {role: client}}
    - podSelector: {}
    ports: [{port: 80, endPort: 81}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: clients, namespace: beta}
spec:
  podSelector: {matchLabels: {role: client}}
  policyTypes: [Ingress, Egress]
  egress:
  - to: [{podSelector: {}}]
  - to: [{namespaceSelector: {matchExpressions: [{key: env, operator: NotIn, values: [prod]}]}}]
    ports: [{protocol: TCP, port: 81}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db-silent, namespace: gamma}
spec:
  podSelector: {matchLabels: {app: db}}
  policyTypes: [Egress]
`

// truthIPBlockPolicies are the truth table's ipBlocks that cover pods (an
// ipBlock matches every address in it, pods' included; a peer matches by
// identity or by address), templated with the pods' addresses:
//
//	gamma client (node 1): egress to node 2's pod range except a-db (every
//	    port), and to a-web's /32 or gamma's web pods (podSelector) on UDP 80;
//	gamma web (node 1): ingress from node 1's pod range except b-cli (every
//	    port), from node 2's pod range on TCP 80, and from team=alpha
//	    namespaces' pods (namespaceSelector) on UDP 81.
func truthIPBlockPolicies(pods map[string]NamedPod) string {
	addr := func(name string) netip.Addr { p := pods[name]; return p.PodAddr() }
	return fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: cli-to-cidrs, namespace: gamma}
spec:
  podSelector: {matchLabels: {role: client}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: %[1]s, except: [%[3]s/32]}}]
  - to: [{ipBlock: {cidr: %[4]s/32}}, {podSelector: {matchLabels: {app: web}}}]
    ports: [{protocol: UDP, port: 80}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-from-cidrs, namespace: gamma}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress:
  - from: [{ipBlock: {cidr: %[2]s, except: [%[5]s/32]}}]
  - from: [{ipBlock: {cidr: %[1]s}}]
    ports: [{protocol: TCP, port: 80}]
  - from: [{namespaceSelector: {matchLabels: {team: alpha}}}]
    ports: [{protocol: UDP, port: 81}]
`, PodCIDR(2), PodCIDR(1), addr("a-db"), addr("a-web"), addr("b-cli"))
}

var truthNamespaces = map[string]map[string]string{
	"alpha": {"team": "alpha", "env": "prod"},
	"beta":  {"team": "beta", "env": "prod"},
	"gamma": {"env": "dev"},
}

// truthPods: named ports vary per pod so that a port name resolves to
// different numbers (and protocols) on different receivers.
var truthPods = []labPodSpec{
	{name: "a-web", ns: "alpha", node: 1, labels: "app=web", ports: "svc=80/TCP,alt=81/UDP"},
	{name: "a-db", ns: "alpha", node: 2, labels: "app=db", ports: "svc=81/TCP"},
	{name: "a-cli", ns: "alpha", node: 2, labels: "role=client"},
	{name: "b-web", ns: "beta", node: 2, labels: "app=web", ports: "svc=81/TCP"},
	{name: "b-db", ns: "beta", node: 1, labels: "app=db,tier=back", ports: "svc=80/TCP"},
	{name: "b-cli", ns: "beta", node: 1, labels: "role=client"},
	{name: "g-web", ns: "gamma", node: 1, labels: "app=web", ports: "svc=80/UDP"},
	{name: "g-db", ns: "gamma", node: 2, labels: "app=db"},
	{name: "g-cli", ns: "gamma", node: 1, labels: "role=client"},
}

func namespaceObjects(ns map[string]map[string]string) string {
	var b strings.Builder
	names := make([]string, 0, len(ns))
	for n := range ns {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(&b, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n  labels:\n", n)
		for k, v := range ns[n] {
			fmt.Fprintf(&b, "    %s: %s\n", k, v)
		}
		b.WriteString("---\n")
	}
	return b.String()
}

// truthPeer is a truth-table endpoint: a pod or a raw (external) host.
type truthPeer struct {
	name string
	ns   string // netns
	ip   netip.Addr
	node int // the node that holds the endpoint; 0 for raw hosts
}

func policyTruthTable(t *testing.T, lk func(t *testing.T, args ...string) (string, error)) {
	pods := addLabPods(t, lk, truthPods)
	routeRawHosts(t)
	var peers []truthPeer
	// The independent model of NetworkPolicy semantics (pkg/policy's unit
	// tests check the compiler against it too) gives each cell's verdict.
	allPolicies := truthPolicies + "---\n" + truthIPBlockPolicies(pods)
	policies, err := policymodel.DecodePolicies(allPolicies)
	if err != nil {
		t.Fatal(err)
	}
	model := &policymodel.Model{NamespaceLabels: truthNamespaces, Policies: policies}
	for _, spec := range truthPods {
		p := pods[spec.name]
		mp := policymodel.Pod{Name: p.Name, Namespace: p.Namespace, IP: p.PodAddr(), Labels: p.Labels}
		for _, pp := range p.Ports {
			mp.Ports = append(mp.Ports, policymodel.Port{Name: pp.Name, Port: int(pp.Port), Protocol: corev1.Protocol(pp.Protocol)})
		}
		model.Pods = append(model.Pods, mp)
		peers = append(peers, truthPeer{name: p.Name, ns: p.NS, ip: p.PodAddr(), node: p.Node})
	}
	for r := 1; r <= RawHosts && !routedLab(); r++ { // routed underlay: no route between external hosts and pods
		peers = append(peers, truthPeer{name: fmt.Sprintf("raw%d", r), ns: RawNS(r), ip: netip.MustParseAddr(RawIP(r))})
	}
	for _, p := range peers {
		startNameServer(t, p.ns, p.name, []int{80, 81}, []int{80, 81})
	}
	file := writeTemp(t, "truth.yaml", namespaceObjects(truthNamespaces)+allPolicies)
	if _, err := lk(t, "lab", "apply", "-f", file); err != nil {
		t.Fatal(err)
	}

	type cell struct {
		src, dst truthPeer
		proto    string
		port     int
		want     policymodel.Verdict
	}
	var cells []cell
	var probes []netProbe
	for _, src := range peers {
		for _, dst := range peers {
			if src.name == dst.name || (src.node == 0 && dst.node == 0) {
				continue
			}
			for _, proto := range []string{"TCP", "UDP"} {
				for _, port := range []int{80, 81} {
					c := cell{src: src, dst: dst, proto: proto, port: port, want: model.Decide(src.ip, dst.ip, corev1.Protocol(proto), port)}
					cells = append(cells, c)
					probes = append(probes, netProbe{From: src.ns, Proto: strings.ToLower(proto), Addr: fmt.Sprintf("%s:%d", dst.ip, port)})
				}
			}
		}
	}
	before := map[int]map[string]*apiv1.EndpointCounters{1: endpointCounters(t, 1), 2: endpointCounters(t, 2)}
	t0 := time.Now()
	results := askAll(probes, 32, 1500*time.Millisecond, 2)
	elapsed := time.Since(t0)
	after := map[int]map[string]*apiv1.EndpointCounters{1: endpointCounters(t, 1), 2: endpointCounters(t, 2)}

	// Expected policy drops per endpoint: a cell denied by the sender's
	// egress drops on the sender's node, charged to the sender; one denied by
	// the receiver's ingress on the receiver's node, charged to the receiver.
	wantDrops := map[string]map[string]int{} // pod name -> reason -> denied cells
	counts := map[policymodel.Verdict]int{}
	var wrong []string
	for i, c := range cells {
		counts[c.want]++
		r := results[i]
		got := "allow"
		if r.Err != nil {
			got = "no answer"
		} else if r.Answer != c.dst.name {
			got = "answer from " + r.Answer
		}
		if (c.want == policymodel.Allowed) != (got == "allow") {
			detail := ""
			if r.Err != nil {
				detail = ": " + r.Err.Error()
			}
			wrong = append(wrong, fmt.Sprintf("%s -> %s %s/%d: model %s, datapath %s%s", c.src.name, c.dst.name, c.proto, c.port, c.want, got, detail))
		}
		switch c.want {
		case policymodel.DeniedEgress:
			addDrop(wantDrops, c.src.name, "policy-egress")
		case policymodel.DeniedIngress:
			addDrop(wantDrops, c.dst.name, "policy-ingress")
		}
	}
	t.Logf("truth table: %d cells (%d allowed, %d denied at egress, %d at ingress) in %s",
		len(cells), counts[policymodel.Allowed], counts[policymodel.DeniedEgress], counts[policymodel.DeniedIngress], elapsed.Round(10*time.Millisecond))
	if len(wrong) > 0 {
		t.Errorf("%d of %d cells disagree with the model:\n%s", len(wrong), len(cells), strings.Join(wrong, "\n"))
	}
	for _, kind := range []policymodel.Verdict{policymodel.Allowed, policymodel.DeniedEgress, policymodel.DeniedIngress} {
		if counts[kind] < 10 {
			t.Errorf("the policy set gives only %d %s cells: the table does not exercise the datapath", counts[kind], kind)
		}
	}
	for _, p := range peers {
		if p.node == 0 {
			continue
		}
		b, a := before[p.node][p.ip.String()], after[p.node][p.ip.String()]
		if a == nil {
			t.Errorf("%s: no endpoint %s on node %d", p.name, p.ip, p.node)
			continue
		}
		for _, reason := range []string{"policy-egress", "policy-ingress"} {
			want := wantDrops[p.name][reason]
			got := a.GetDrops()[reason] - b.GetDrops()[reason]
			switch {
			case want == 0 && got != 0:
				t.Errorf("%s (node %d): %d %s drops, the model denies none of its cells", p.name, p.node, got, reason)
			case uint64(want) > got:
				t.Errorf("%s (node %d): %d %s drops for %d denied cells", p.name, p.node, got, reason, want)
			}
		}
	}
	// Verdict counters: every policy that isolates a probed pod saw its
	// drops or allows; an allow-nothing policy denied.
	c, closeFn, err := agentClient(AgentSocket(2))
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	resp, err := c.ListPolicies(context.Background(), &apiv1.ListPoliciesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range resp.GetPolicies() {
		t.Logf("node 2 policy %s/%s: allowed %d denied %d", p.GetNamespace(), p.GetName(), p.GetAllowedPackets(), p.GetDeniedPackets())
		if p.GetName() == "db-silent" && p.GetDeniedPackets() == 0 {
			t.Errorf("gamma/db-silent denied nothing on node 2 (g-db's own connections)")
		}
	}
}

func addDrop(m map[string]map[string]int, pod, reason string) {
	if m[pod] == nil {
		m[pod] = map[string]int{}
	}
	m[pod][reason]++
}
