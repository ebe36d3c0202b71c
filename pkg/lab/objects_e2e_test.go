package lab

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"

	apiv1 "github.com/lanekit/lanekit/api/v1"
)

const invServices = `apiVersion: v1
kind: Service
metadata: {name: api, namespace: inv}
spec:
  clusterIP: 10.96.130.10
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: api-1, namespace: inv, labels: {kubernetes.io/service-name: api}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.244.1.201]
- addresses: [10.244.2.201]
`

const invPolicies = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: api-in, namespace: inv}
spec:
  podSelector: {matchLabels: {app: api}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {team: alpha}}}]
    ports: [{port: 8080}]
  - from: [{ipBlock: {cidr: 192.168.0.0/16, except: [192.168.1.0/24]}}]
`

// invalidCase is a file that must be refused as a whole.
type invalidCase struct {
	name    string
	cmd     string // "service" or "policy": which `lanekit X apply` gets it
	data    string
	wantErr []string // substrings the error must contain (object and field)
	cliOnly bool     // the refusal is the command's (kind filter), not the agent's
}

var invalidCases = []invalidCase{
	{name: "bad port among valid objects", cmd: "service", wantErr: []string{"inv/bad", "port"}, data: `apiVersion: v1
kind: Service
metadata: {name: api, namespace: inv}
spec:
  clusterIP: 10.96.130.10
  ports: [{name: http, port: 80, targetPort: 8080}, {name: https, port: 443, targetPort: 8443}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: api-2, namespace: inv, labels: {kubernetes.io/service-name: api}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.244.1.202]}]
---
apiVersion: v1
kind: Service
metadata: {name: bad, namespace: inv}
spec:
  clusterIP: 10.96.130.11
  ports: [{name: http, port: 70000}]
`},
	{name: "frontend claimed twice (valid objects, conflicting set)", cmd: "service", wantErr: []string{"10.96.130.10"}, data: `apiVersion: v1
kind: Service
metadata: {name: api2, namespace: inv}
spec:
  clusterIP: 10.96.130.20
  ports: [{name: http, port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: clash, namespace: inv}
spec:
  clusterIP: 10.96.130.10
  ports: [{name: http, port: 80}]
`},
	{name: "bad endpoint address", cmd: "service", wantErr: []string{"inv/api-3", "10.244.1.300"}, data: `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: api-3, namespace: inv, labels: {kubernetes.io/service-name: api}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.244.1.300]}]
`},
	{name: "selector that does not parse", cmd: "policy", wantErr: []string{"inv/bad", "Bogus"}, data: `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: api-in, namespace: inv}
spec:
  podSelector: {matchLabels: {app: api}}
  policyTypes: [Ingress, Egress]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: bad, namespace: inv}
spec:
  podSelector: {matchExpressions: [{key: app, operator: Bogus, values: [x]}]}
`},
	{name: "unknown protocol", cmd: "policy", wantErr: []string{"inv/icmp", "ICMP"}, data: `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: fresh, namespace: inv}
spec:
  podSelector: {}
  policyTypes: [Egress]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: icmp, namespace: inv}
spec:
  podSelector: {}
  ingress: [{ports: [{protocol: ICMP, port: 9}]}]
`},
	{name: "unknown field", cmd: "policy", wantErr: []string{"podSelectr"}, data: `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: fresh, namespace: inv}
spec:
  podSelector: {}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: typo, namespace: inv}
spec:
  podSelectr: {}
`},
	{name: "bad ipBlock", cmd: "policy", wantErr: []string{"inv/cidr", "10.0.0.0/33"}, data: `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: cidr, namespace: inv}
spec:
  podSelector: {}
  egress: [{to: [{ipBlock: {cidr: 10.0.0.0/33}}]}]
`},
	{name: "endPort below port", cmd: "policy", wantErr: []string{"inv/range", "endPort"}, data: `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: range, namespace: inv}
spec:
  podSelector: {}
  ingress: [{ports: [{port: 81, endPort: 80}]}]
`},
	{name: "not YAML", cmd: "policy", wantErr: []string{"yaml"}, data: "kind: [\n  - {\n"},
	{name: "a Service in a policy file", cmd: "policy", cliOnly: true, wantErr: []string{"NetworkPolicy"}, data: invPolicies + "---\n" + invServices},
}

// ctlSnapshot is what a refused apply must leave exactly as it was: the
// listed services and policies, the stored objects and the BPF maps' entry
// counts, on every node.
func ctlSnapshot(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for node := 1; node <= 2; node++ {
		c, closeFn, err := agentClient(AgentSocket(node))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		svcs, err := c.ListServices(ctx, &apiv1.ListServicesRequest{})
		if err != nil {
			t.Fatalf("node %d list services: %v", node, err)
		}
		pols, err := c.ListPolicies(ctx, &apiv1.ListPoliciesRequest{})
		if err != nil {
			t.Fatalf("node %d list policies: %v", node, err)
		}
		st, err := c.Status(ctx, &apiv1.StatusRequest{})
		if err != nil {
			t.Fatalf("node %d status: %v", node, err)
		}
		cancel()
		closeFn()
		fmt.Fprintf(&b, "node %d\n services: %s\n", node, prototext.Format(svcs))
		for _, p := range pols.GetPolicies() {
			fmt.Fprintf(&b, " policy %s/%s ingress=%v egress=%v\n", p.GetNamespace(), p.GetName(), p.GetIngress(), p.GetEgress())
		}
		cp := st.GetControlPlane()
		kinds := make([]string, 0, len(cp.GetObjects()))
		for k, n := range cp.GetObjects() {
			kinds = append(kinds, fmt.Sprintf("%s=%d", k, n))
		}
		sort.Strings(kinds)
		fmt.Fprintf(&b, " objects %v services=%d frontends=%d backends=%d policies=%d identities=%d rules=%d pending=%d\n",
			kinds, cp.GetServices(), cp.GetFrontends(), cp.GetBackends(), cp.GetPolicies(), cp.GetIdentities(), cp.GetPolicyRules(), cp.GetPendingUpdates())
		for _, m := range []string{"lk_lb_svc", "lk_lb_backends", "lk_lb_revnat", "lk_lb_maglev",
			"lk_policy_ipcache", "lk_policy_cidrs", "lk_policy_isolation", "lk_policy_rules"} {
			fmt.Fprintf(&b, " %s=%d", m, mapEntries(t, node, m))
		}
		b.WriteString("\n")
	}
	return b.String()
}

func invalidObjectsE2E(t *testing.T, lk func(t *testing.T, args ...string) (string, error)) {
	apply := func(t *testing.T, cmd, file string, node int) (string, error) {
		return lk(t, cmd, "apply", "-f", file, "--socket", AgentSocket(node))
	}
	good := map[string]string{"service": writeTemp(t, "svc.yaml", invServices), "policy": writeTemp(t, "pol.yaml", invPolicies)}
	for node := 1; node <= 2; node++ {
		for _, cmd := range []string{"service", "policy"} {
			if _, err := apply(t, cmd, good[cmd], node); err != nil {
				t.Fatal(err)
			}
		}
	}
	list := func(t *testing.T) string {
		var b strings.Builder
		for _, cmd := range []string{"service", "policy"} {
			out, err := lk(t, cmd, "list", "--socket", AgentSocket(1))
			if err != nil {
				t.Fatal(err)
			}
			b.WriteString(out)
		}
		return b.String()
	}
	listBefore, before := list(t), ctlSnapshot(t)
	if !strings.Contains(listBefore, "inv/api") || !strings.Contains(listBefore, "inv/api-in") {
		t.Fatalf("the valid objects are not listed:\n%s", listBefore)
	}
	t.Logf("state before:\n%s", before)

	for _, tc := range invalidCases {
		t.Run(strings.ReplaceAll(tc.name, " ", "-"), func(t *testing.T) {
			file := writeTemp(t, "bad.yaml", tc.data)
			_, err := apply(t, tc.cmd, file, 1)
			if err == nil {
				t.Fatalf("lanekit %s apply accepted it", tc.cmd)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("lanekit %s apply error does not name %q: %v", tc.cmd, w, err)
				}
			}
			if !tc.cliOnly {
				// The agent's own check, without the CLI's local one.
				c, closeFn, derr := agentClient(AgentSocket(2))
				if derr != nil {
					t.Fatal(derr)
				}
				defer closeFn()
				_, err := c.ApplyObjects(context.Background(), &apiv1.ApplyObjectsRequest{Data: []byte(tc.data)})
				if status.Code(err) != codes.InvalidArgument {
					t.Errorf("ApplyObjects on node 2 = %v, want InvalidArgument", err)
				}
				for _, w := range tc.wantErr {
					if err != nil && !strings.Contains(err.Error(), w) {
						t.Errorf("ApplyObjects error does not name %q: %v", w, err)
					}
				}
			}
			if after := ctlSnapshot(t); after != before {
				t.Errorf("refused file changed the state:\n%s\n---- was ----\n%s", after, before)
			}
		})
	}
	if after := list(t); after != listBefore {
		t.Errorf("service/policy list changed after refused files:\n%s\n---- was ----\n%s", after, listBefore)
	}

	// Fuzzed files through the API: mutations of a valid file. A refused one
	// changes nothing; an accepted one is applied whole (and becomes the
	// new state); the agent answers throughout.
	c, closeFn, err := agentClient(AgentSocket(1))
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	seed := uint64(time.Now().UnixNano())
	t.Logf("fuzz seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 12))
	base := invServices + "---\n" + invPolicies
	refused, accepted := 0, 0
	state := ctlSnapshot(t)
	for i := range 60 {
		data := mutate(rng, base)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := c.ApplyObjects(ctx, &apiv1.ApplyObjectsRequest{Data: []byte(data)})
		cancel()
		switch code := status.Code(err); code {
		case codes.OK:
			accepted++
			state = ctlSnapshot(t)
		case codes.InvalidArgument:
			refused++
			if after := ctlSnapshot(t); after != state {
				t.Fatalf("fuzz %d: refused input (%v) changed the state:\n%s\n---- was ----\n%s\ninput:\n%s", i, err, after, state, data)
			}
		default:
			t.Fatalf("fuzz %d: ApplyObjects = %v (want OK or InvalidArgument)\ninput:\n%s", i, err, data)
		}
	}
	t.Logf("fuzz: %d mutated files refused, %d accepted", refused, accepted)
	st, err := LoadState()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range st.Nodes {
		if !alive(n.AgentPID) {
			t.Errorf("agent on %s (pid %d) is gone", n.NS, n.AgentPID)
		}
		if log, err := os.ReadFile(AgentLog(n.Index)); err == nil && strings.Contains(string(log), "panic") {
			t.Errorf("agent on %s logged a panic: %s", n.NS, logTail(AgentLog(n.Index)))
		}
	}
}

// mutate applies 1-3 random edits to a valid file: a changed byte, a
// changed digit (ports, addresses out of range), a dropped or repeated line,
// a truncation.
func mutate(rng *rand.Rand, s string) string {
	b := []byte(s)
	for range 1 + rng.IntN(3) {
		if len(b) == 0 {
			break
		}
		switch rng.IntN(5) {
		case 0:
			b[rng.IntN(len(b))] = byte(32 + rng.IntN(95))
		case 1:
			var digits []int
			for i, c := range b {
				if c >= '0' && c <= '9' {
					digits = append(digits, i)
				}
			}
			if len(digits) > 0 {
				b[digits[rng.IntN(len(digits))]] = byte('0' + rng.IntN(10))
			}
		case 2, 3:
			lines := strings.Split(string(b), "\n")
			i := rng.IntN(len(lines))
			if rng.IntN(2) == 0 {
				lines = append(lines[:i], lines[i+1:]...)
			} else {
				lines = append(lines[:i+1], lines[i:]...)
			}
			b = []byte(strings.Join(lines, "\n"))
		case 4:
			b = b[:rng.IntN(len(b))]
		}
	}
	return string(b)
}
