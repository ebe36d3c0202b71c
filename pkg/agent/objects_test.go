package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/ipam"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/netdev"
	"github.com/lanekit/lanekit/pkg/policy"
	"github.com/lanekit/lanekit/pkg/service"
	"github.com/lanekit/lanekit/pkg/store"
)

var (
	ctlPodCIDR  = netip.MustParsePrefix("10.244.1.0/24")
	ctlNodeAddr = netip.MustParseAddr("192.168.50.1")
)

// newCtlAgent builds an agent around the store in dir and dp without devices
// or namespaces (the control plane needs neither), so it runs unprivileged.
func newCtlAgent(t testing.TB, dir string, dp datapath.Datapath) *Agent {
	t.Helper()
	return newCtlAgentWith(t, dir, dp, nil)
}

// newCtlAgentWith is newCtlAgent with its config changed by edit (nil: none).
func newCtlAgentWith(t testing.TB, dir string, dp datapath.Datapath, edit func(*Config)) *Agent {
	t.Helper()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ip, err := ipam.New(st, ctlPodCIDR)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{StateDir: dir, PodCIDR: ctlPodCIDR, NodeAddrs: []netip.Addr{ctlNodeAddr}}
	if edit != nil {
		edit(&cfg)
	}
	a := &Agent{cfg: cfg, log: quietLog(), st: st, ipam: ip, host: &netdev.Host{}, dp: dp, backend: "test"}
	if err := a.restoreControlPlane(); err != nil {
		st.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return a
}

func decodeObjs(t testing.TB, y string) []k8sobj.Object {
	t.Helper()
	objs, err := k8sobj.Decode([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

const ctlServices = `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: http, nodePort: 30080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.244.1.2]
- addresses: [10.244.1.3]
- addresses: [10.244.2.2]
`

const ctlPolicy = `
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {team: a}}
---
apiVersion: v1
kind: Pod
metadata: {name: client-remote, namespace: shop, labels: {role: client}}
spec: {nodeName: node-2, containers: [{name: c, image: x}]}
status: {podIP: 10.244.2.9}
---
apiVersion: v1
kind: Pod
metadata: {name: other-remote, namespace: shop, labels: {role: other}}
spec: {nodeName: node-2, containers: [{name: c, image: x}]}
status: {podIP: 10.244.2.10}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-from-clients, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
    ports: [{port: http}]
`

// addLocal records a local endpoint as a CNI ADD would (namespace, name and
// labels in the CNI args) and tells the control plane.
func addLocal(t testing.TB, a *Agent, id uint32, ip, ns, name string, labels map[string]string) {
	t.Helper()
	args := map[string]string{ArgPodNamespace: ns, ArgPodName: name, "IgnoreUnknown": "1"}
	for k, v := range labels {
		args[ArgLabelPrefix+k] = v
	}
	ep := endpoint.Endpoint{ID: id, Kind: endpoint.KindPod, ContainerID: name, IfName: "eth0", IP: netip.MustParseAddr(ip), Labels: args}
	if err := a.st.Update(func(tx *store.Tx) error { return tx.Put(store.Endpoints, []byte(ep.Key()), ep) }); err != nil {
		t.Fatal(err)
	}
	a.endpointsChanged()
}

func delLocal(t *testing.T, a *Agent, name string) {
	t.Helper()
	if err := a.st.Update(func(tx *store.Tx) error { return tx.Delete(store.Endpoints, []byte(endpoint.Key(name, "eth0"))) }); err != nil {
		t.Fatal(err)
	}
	a.endpointsChanged()
}

func svcKey(addr string, port uint16, scope service.Scope) service.ServiceKey {
	return service.ServiceKey{Addr: netip.MustParseAddr(addr).As4(), Port: port, Proto: uint8(service.TCP), Scope: uint8(scope)}
}

func TestControlPlaneServicesAndPolicy(t *testing.T) {
	dp := agenttest.NewMemoryDatapath()
	a := newCtlAgent(t, t.TempDir(), dp)
	if err := a.UpsertObjects(decodeObjs(t, ctlServices+"---\n"+ctlPolicy)); err != nil {
		t.Fatal(err)
	}
	// ClusterIP: flows spread over all three backends.
	seen := map[netip.AddrPort]int{}
	for h := range uint32(3000) {
		b, ok := dp.Resolve(svcKey("10.96.0.10", 80, service.ScopeClusterIP), h*2654435761)
		if !ok {
			t.Fatal("cluster IP not programmed")
		}
		seen[b]++
	}
	if len(seen) != 3 {
		t.Fatalf("backends used: %v", seen)
	}
	for b, n := range seen {
		if b.Port() != 8080 || n < 600 {
			t.Errorf("backend %v took %d of 3000 flows", b, n)
		}
	}
	// NodePort on the node address.
	if _, ok := dp.Resolve(svcKey(ctlNodeAddr.String(), 30080, service.ScopeNodePort), 1); !ok {
		t.Error("node port not programmed on the node address")
	}
	// Policy: a local web pod (labels from CNI args) is isolated; only
	// remote clients reach its named port.
	addLocal(t, a, 1, "10.244.1.2", "shop", "web-a", map[string]string{"app": "web"})
	if err := a.UpsertObjects(decodeObjs(t, `
apiVersion: v1
kind: Pod
metadata: {name: web-a, namespace: shop, labels: {app: web}}
spec: {containers: [{name: c, image: x, ports: [{name: http, containerPort: 8080}]}]}
status: {podIP: 10.244.1.2}
`)); err != nil {
		t.Fatal(err)
	}
	web, client, other := netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("10.244.2.9"), netip.MustParseAddr("10.244.2.10")
	if !dp.Allowed(client, web, policy.ProtoTCP, 8080) {
		t.Error("client -> web:8080 denied")
	}
	if dp.Allowed(other, web, policy.ProtoTCP, 8080) {
		t.Error("other -> web:8080 allowed")
	}
	if dp.Allowed(client, web, policy.ProtoTCP, 9090) {
		t.Error("client -> web:9090 allowed (only the named port is)")
	}
	info, ok := a.PolicyInfoOf(1)
	if !ok || info.Namespace != "shop" || info.Labels["app"] != "web" || !info.FromPod || info.Identity == 0 {
		t.Errorf("policy info of endpoint 1: %+v %v", info, ok)
	}
	if id, _ := dp.IdentityOf(web); uint32(id) != info.Identity {
		t.Errorf("ipcache identity %d, API says %d", id, info.Identity)
	}
	pols, err := a.Policies()
	if err != nil || len(pols) != 1 || pols[0].Name != "web-from-clients" || !pols[0].Ingress || pols[0].Egress || pols[0].Index != 0 {
		t.Errorf("Policies() = %+v, %v", pols, err)
	}
	st := a.ControlStats()
	if st.Services != 1 || st.Frontends != 2 || st.Backends != 6 || st.Policies != 1 || st.Objects[k8sobj.KindPod] != 3 {
		t.Errorf("stats %+v", st)
	}
}

func TestUpsertObjectsAllOrNothing(t *testing.T) {
	dp := agenttest.NewMemoryDatapath()
	dir := t.TempDir()
	a := newCtlAgent(t, dir, dp)
	if err := a.UpsertObjects(decodeObjs(t, ctlServices)); err != nil {
		t.Fatal(err)
	}
	before := snapshotState(t, a, dp)
	good := decodeObjs(t, ctlPolicy)
	badSvc := decodeObjs(t, ctlServices)[0]
	badSvc.Service = badSvc.Service.DeepCopy()
	badSvc.Service.Name = "web2"
	badSvc.Service.Spec.ClusterIP = "10.96.0.300"
	clash := decodeObjs(t, ctlServices)[0]
	clash.Service = clash.Service.DeepCopy()
	clash.Service.Name = "web3" // same cluster IP and port as shop/web
	badPol := decodeObjs(t, ctlPolicy)[3]
	badPol.NetworkPolicy = badPol.NetworkPolicy.DeepCopy()
	badPol.NetworkPolicy.Spec.Ingress[0].From[0].PodSelector.MatchLabels["bad key!"] = "x"
	for _, tc := range []struct {
		name string
		objs []k8sobj.Object
		want []string
	}{
		{"invalid field", append(good, badSvc), []string{"Service shop/web2", "spec.clusterIP", "10.96.0.300"}},
		{"frontend clash", append(good, clash), []string{"shop/web3", "already belongs to service shop/web"}},
		{"invalid policy", append(good[:3:3], badPol), []string{"NetworkPolicy shop/web-from-clients", "spec.ingress[0].from[0].podSelector"}},
		{"duplicate", append(good, good[0]), []string{"Namespace shop", "given twice"}},
		{"empty object", append(good, k8sobj.Object{Kind: k8sobj.KindPod}), []string{"empty object"}},
	} {
		err := a.UpsertObjects(tc.objs)
		if err == nil || !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", tc.name, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not name %q", tc.name, err, w)
			}
		}
		if after := snapshotState(t, a, dp); after != before {
			t.Errorf("%s: state changed:\n%s\n---- was ----\n%s", tc.name, after, before)
		}
	}
	// A multi-document file with one invalid document never reaches the agent.
	if _, err := k8sobj.Decode([]byte(ctlPolicy + "---\n" + "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {clusterIP: 1.2.3}\n")); err == nil {
		t.Fatal("invalid multi-doc file decoded")
	}
}

// snapshotState renders the stored objects, the in-memory objects and the
// datapath maps, to compare before/after a rejected change.
func snapshotState(t testing.TB, a *Agent, dp *agenttest.MemoryDatapath) string {
	t.Helper()
	var b strings.Builder
	for _, o := range a.Objects("") {
		raw, _ := k8sobj.EncodeJSON(o)
		b.WriteString(o.Key() + " " + string(raw) + "\n")
	}
	err := a.st.View(func(tx *store.Tx) error {
		n, err := tx.Count(store.Objects)
		fmt.Fprintf(&b, "stored %d\n", n)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	s, be, m, r := dp.ServiceEntries()
	ic, c, ru, is := dp.PolicyEntries()
	fmt.Fprintf(&b, "maps %d %d %d %d %d %d %d %d", s, be, m, r, ic, c, ru, is)
	return b.String()
}
