package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
	"github.com/lanekit/lanekit/pkg/policy"
)

// policyPods is pods of one agent in namespace shop, with helpers to
// probe TCP between them and read their policy drop counters.
type policyPods struct {
	t   *testing.T
	a   *Agent
	dp  *datapath.Loader
	ns  map[string]ns.NetNS
	id  map[string]uint32
	ip  map[string]netip.Addr
	lns []net.Listener
}

func newPolicyPods(t *testing.T, a *Agent, dp *datapath.Loader) *policyPods {
	p := &policyPods{t: t, a: a, dp: dp, ns: map[string]ns.NetNS{}, id: map[string]uint32{}, ip: map[string]netip.Addr{}}
	t.Cleanup(func() {
		for _, l := range p.lns {
			l.Close()
		}
	})
	return p
}

// add creates pod name (label app=name) listening on TCP ports.
func (p *policyPods) add(name string, ports ...int) {
	p.t.Helper()
	n := netnstest.New(p.t, "pf"+name)
	ep, err := p.a.Add(AddRequest{ContainerID: name, IfName: "eth0", Netns: n.Path(),
		Labels: map[string]string{ArgPodNamespace: "shop", ArgPodName: name, ArgLabelPrefix + "app": name}})
	if err != nil {
		p.t.Fatalf("add %s: %v", name, err)
	}
	p.ns[name], p.id[name], p.ip[name] = n, ep.ID, ep.IP
	for _, port := range ports {
		if err := n.Do(func(ns.NetNS) error {
			l, err := net.Listen("tcp4", fmt.Sprintf(":%d", port))
			if err == nil {
				p.lns = append(p.lns, l)
				go func() {
					for {
						c, err := l.Accept()
						if err != nil {
							return
						}
						c.Close()
					}
				}()
			}
			return err
		}); err != nil {
			p.t.Fatalf("listen in %s: %v", name, err)
		}
	}
}

// reaches reports whether from connects to addr:port.
func (p *policyPods) reaches(from string, addr netip.Addr, port uint16) bool {
	p.t.Helper()
	var c net.Conn
	err := p.ns[from].Do(func(ns.NetNS) (err error) {
		c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(addr, port).String(), 400*time.Millisecond)
		return err
	})
	if err == nil {
		c.Close()
	}
	return err == nil
}

func (p *policyPods) drops(pod string, reason datapath.DropReason) uint64 {
	p.t.Helper()
	c, err := p.dp.Counters(p.id[pod])
	if err != nil {
		p.t.Fatal(err)
	}
	return c.Drops[reason]
}

// expect checks that from → to:port connects (want) or is dropped by to's
// ingress policy (its DROP_POLICY_INGRESS counter grows).
func (p *policyPods) expect(what, from, to string, port uint16, want bool) {
	p.t.Helper()
	before := p.drops(to, datapath.DropPolicyIngress)
	got := p.reaches(from, p.ip[to], port)
	drops := p.drops(to, datapath.DropPolicyIngress) - before
	switch {
	case got != want:
		p.t.Errorf("%s: %s → %s:%d connects %v, want %v (ingress policy drops +%d)", what, from, to, port, got, want, drops)
	case !want && drops == 0:
		p.t.Errorf("%s: %s → %s:%d did not connect, but %s's ingress policy drop counter did not grow", what, from, to, port, to)
	}
}

func allowFrom(name, subject string, port int) string {
	return fmt.Sprintf(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: %s, namespace: shop}
spec:
  podSelector: {matchLabels: {app: %s}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: %d}]
`, name, subject, port)
}

// TestFullPolicyMapsFailClosed: the real agent on the BPF datapath with a
// rule map of 2 entries and four NetworkPolicies of one rule entry each
// (a-web-81, b-web-82, c-web-83 on web; d-db-84 on db). The first two are
// programmed and enforced (their ports connect, their verdict counters
// count); c and d are left out whole, reported by UnprogrammedPolicies and
// ControlStats (lanekit status, the metrics) — and fail closed: web stays
// isolated (83 is dropped by its ingress policy) and so does db, whose only
// policy was left out (84 is dropped). Deleting a-web-81 programs c-web-83
// (83 connects, 81 is dropped), deleting b-web-82 then programs d-db-84,
// without a restart. Before, the whole update was refused: web and db stayed
// open.
func TestFullPolicyMapsFailClosed(t *testing.T) {
	fx := newFixture(t)
	a, dp := startBPFAgent(t, fx, "polfull", func(c *Config) { c.PolicyMaps = datapath.PolicySizes{Rules: 2} })
	p := newPolicyPods(t, a, dp)
	p.add("client")
	p.add("web", 81, 82, 83)
	p.add("db", 84)
	for _, c := range []struct {
		to   string
		port uint16
	}{{"web", 81}, {"web", 83}, {"db", 84}} {
		if !p.reaches("client", p.ip[c.to], c.port) {
			t.Fatalf("without a policy client does not reach %s:%d: the test cannot tell isolation from a broken path", c.to, c.port)
		}
	}
	var all string
	for _, y := range []string{allowFrom("a-web-81", "web", 81), allowFrom("b-web-82", "web", 82), allowFrom("c-web-83", "web", 83), allowFrom("d-db-84", "db", 84)} {
		all += "---" + y
	}
	if err := a.UpsertObjects(decodeObjs(t, all)); err != nil {
		t.Fatalf("four policies, room for two: refused (%v)", err)
	}
	leftOut := func() []string {
		var out []string
		for _, l := range a.UnprogrammedPolicies() {
			if l.Map != policy.MapRules {
				t.Errorf("%s left out for %s, want %s", l.Policy, l.Map, policy.MapRules)
			}
			out = append(out, l.Policy.Name)
		}
		return out
	}
	rulesMap := func() MapStat {
		for _, m := range a.ControlStats().Maps {
			if m.Map == policy.MapRules {
				return m
			}
		}
		t.Fatal("lk_policy_rules not in ControlStats")
		return MapStat{}
	}
	programmed := func() int {
		c, err := dp.DumpPolicy()
		if err != nil {
			t.Fatal(err)
		}
		return len(c.Rules)
	}
	if got := leftOut(); !slices.Equal(got, []string{"c-web-83", "d-db-84"}) {
		t.Errorf("left out %v, want c-web-83 d-db-84", got)
	}
	if m := rulesMap(); m.Entries != 2 || m.Capacity != 2 || m.UnprogrammedPolicies != 2 {
		t.Errorf("lk_policy_rules %+v, want 2/2 entries, 2 policies not programmed", m)
	}
	pols, err := a.Policies() // lanekit policy list
	if err != nil {
		t.Fatal(err)
	}
	for _, pi := range pols {
		if want := map[string]string{"c-web-83": policy.MapRules, "d-db-84": policy.MapRules}[pi.Name]; pi.NotProgrammed != want {
			t.Errorf("policy list: %s not programmed for %q, want %q", pi.Name, pi.NotProgrammed, want)
		}
	}
	if n := programmed(); n != 2 {
		t.Errorf("the datapath holds %d rules, want 2", n)
	}
	p.expect("a-web-81 programmed", "client", "web", 81, true)
	p.expect("b-web-82 programmed", "client", "web", 82, true)
	p.expect("c-web-83 left out, web stays isolated", "client", "web", 83, false)
	p.expect("d-db-84 left out, db stays isolated", "client", "db", 84, false)
	verdicts, err := a.PolicyVerdicts()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a-web-81", "b-web-82"} {
		if verdicts[policy.PolicyRef{Namespace: "shop", Name: name}].Allowed == 0 {
			t.Errorf("%s allowed nothing by its verdict counters: %v", name, verdicts)
		}
	}

	if err := a.DeleteObject(k8sobj.KindNetworkPolicy, "shop", "a-web-81"); err != nil {
		t.Fatal(err)
	}
	if got := leftOut(); !slices.Equal(got, []string{"d-db-84"}) {
		t.Errorf("after a-web-81 went: left out %v, want d-db-84", got)
	}
	p.expect("c-web-83 programmed once a-web-81 went", "client", "web", 83, true)
	p.expect("a-web-81 gone", "client", "web", 81, false)
	p.expect("d-db-84 still left out", "client", "db", 84, false)

	if err := a.DeleteObject(k8sobj.KindNetworkPolicy, "shop", "b-web-82"); err != nil {
		t.Fatal(err)
	}
	if got := leftOut(); len(got) != 0 {
		t.Errorf("after b-web-82 went: left out %v, want none", got)
	}
	if m := rulesMap(); m.UnprogrammedPolicies != 0 {
		t.Errorf("lk_policy_rules %+v after room returned", m)
	}
	p.expect("d-db-84 programmed once b-web-82 went", "client", "db", 84, true)
}

// TestFullIPCacheFailsClosed: the real agent on the BPF datapath with an
// ipcache of 3 entries (the node's 127.0.0.1 and this node's two pods): a
// remote pod's address does not fit and is reported as left out
// (lk_policy_ipcache). client's egress policy allows web and the remote pod
// by podSelector; client still reaches web, while its SYN to the remote pod's
// unknown address is dropped by its egress policy (the address resolves as
// the world, which no rule admits), never let through. Removing web makes
// room: the remote address is programmed and client's egress admits it.
func TestFullIPCacheFailsClosed(t *testing.T) {
	fx := newFixture(t)
	a, dp := startBPFAgent(t, fx, "ipcfull", func(c *Config) { c.PolicyMaps = datapath.PolicySizes{IPCache: 3} })
	p := newPolicyPods(t, a, dp)
	p.add("client")
	p.add("web", 80)
	remote := netip.MustParseAddr("10.78.0.5")
	if err := a.UpsertObjects(decodeObjs(t, `
apiVersion: v1
kind: Pod
metadata: {name: remote, namespace: shop, labels: {app: remote}}
spec: {nodeName: node-2, containers: [{name: c, image: x}]}
status: {podIP: 10.78.0.5}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-out, namespace: shop}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {app: web}}}, {podSelector: {matchLabels: {app: remote}}}]
    ports: [{port: 80}]
`)); err != nil {
		t.Fatal(err)
	}
	ipcache := func() MapStat {
		for _, m := range a.ControlStats().Maps {
			if m.Map == policy.MapIPCache {
				return m
			}
		}
		t.Fatal("lk_policy_ipcache not in ControlStats")
		return MapStat{}
	}
	known := func(ip netip.Addr) bool {
		c, err := dp.DumpPolicy()
		if err != nil {
			t.Fatal(err)
		}
		_, ok := c.IPCache[ip]
		return ok
	}
	egressDrops := func() uint64 {
		before := p.drops("client", datapath.DropPolicyEgress)
		p.reaches("client", remote, 80) // nothing listens there: only the drop counter tells
		return p.drops("client", datapath.DropPolicyEgress) - before
	}
	if m := ipcache(); m.Entries != 3 || m.UnprogrammedEntries != 1 {
		t.Errorf("lk_policy_ipcache %+v, want 3/3 entries, 1 address left out", m)
	}
	if known(remote) || !known(p.ip["client"]) || !known(p.ip["web"]) {
		t.Fatalf("ipcache: remote %v, client %v, web %v; want this node's pods, not the remote one", known(remote), known(p.ip["client"]), known(p.ip["web"]))
	}
	if !p.reaches("client", p.ip["web"], 80) {
		t.Error("client → web:80 (allowed by podSelector, both known) does not connect")
	}
	if n := egressDrops(); n == 0 {
		t.Error("client → the remote pod's left-out address: not dropped by client's egress policy (an unknown address must get no podSelector allow)")
	}

	if _, err := a.Del("web", "eth0"); err != nil {
		t.Fatal(err)
	}
	if m := ipcache(); m.UnprogrammedEntries != 0 || !known(remote) {
		t.Fatalf("after web went: lk_policy_ipcache %+v, remote programmed %v", m, known(remote))
	}
	if n := egressDrops(); n != 0 {
		t.Errorf("client → the remote pod, its address programmed: dropped %d times by client's egress policy", n)
	}
}

// TestFullIsolationMapSwap: with an isolation map of one entry, replacing
// the NetworkPolicy that isolates web by one that isolates db (one update:
// the API server watcher's ReplaceObjects) must isolate db. The datapath
// writes new isolation entries before it deletes the old ones (fail
// closed), so the full map refused db's entry and the update stuck, db
// open, every later policy update queued behind it.
func TestFullIsolationMapSwap(t *testing.T) {
	fx := newFixture(t)
	a, dp := startBPFAgent(t, fx, "isoswap", func(c *Config) { c.PolicyMaps = datapath.PolicySizes{Identities: 1} })
	p := newPolicyPods(t, a, dp)
	p.add("client")
	p.add("web", 81)
	p.add("db", 84)
	replace := func(y string) {
		t.Helper()
		refused, err := a.ReplaceObjects(k8sobj.KindNetworkPolicy, decodeObjs(t, y))
		if err != nil || len(refused) != 0 {
			t.Fatalf("replace policies: %v %v", refused, err)
		}
	}
	replace(allowFrom("web-81", "web", 81))
	p.expect("web isolated", "client", "web", 82, false)
	replace(allowFrom("db-84", "db", 85))
	p.expect("db isolated by the policy that replaced web's", "client", "db", 84, false)
	p.expect("web no longer isolated", "client", "web", 81, true)
	if st := a.ControlStats(); st.PendingPol != 0 {
		t.Errorf("%d policy updates stuck waiting for a retry", st.PendingPol)
	}
}

// TestFullIPCacheRefusesADD: with an ipcache with room for the node's
// 127.0.0.1 and one pod, a second pod's CNI ADD is refused (ErrPolicyFull,
// naming the map and the flag) and undone: a pod the datapath has no identity
// for would not be isolated by any policy that selects it. The first pod
// keeps its entry (the oldest first); once it goes, the ADD succeeds.
func TestFullIPCacheRefusesADD(t *testing.T) {
	fx := newFixture(t)
	a, dp := startBPFAgent(t, fx, "ipcadd", func(c *Config) { c.PolicyMaps = datapath.PolicySizes{IPCache: 2} })
	p := newPolicyPods(t, a, dp)
	p.add("client")
	webNS := netnstest.New(t, "pfweb2")
	req := AddRequest{ContainerID: "web", IfName: "eth0", Netns: webNS.Path(),
		Labels: map[string]string{ArgPodNamespace: "shop", ArgPodName: "web", ArgLabelPrefix + "app": "web"}}
	_, err := a.Add(req)
	if !errors.Is(err, ErrPolicyFull) || !strings.Contains(err.Error(), "--policy-ipcache") {
		t.Fatalf("ADD with no room in the ipcache: %v, want ErrPolicyFull naming --policy-ipcache", err)
	}
	if _, ok, _ := a.lookup(endpoint.Key("web", "eth0")); ok {
		t.Error("the refused ADD left its endpoint behind")
	}
	c, err := dp.DumpPolicy()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.IPCache[p.ip["client"]]; !ok {
		t.Error("the older pod lost its ipcache entry to the refused one")
	}
	if _, err := a.Del("client", "eth0"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Add(req); err != nil {
		t.Fatalf("ADD once room returned: %v", err)
	}
}
