package agent

import (
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/policy"
	"github.com/lanekit/lanekit/pkg/service"
	"github.com/lanekit/lanekit/pkg/store"
)

func frontendIDs(a *Agent) map[service.FrontendKey]uint32 {
	out := map[service.FrontendKey]uint32{}
	for _, f := range a.Frontends() {
		out[f.Key] = f.FrontendID
	}
	return out
}

func TestRestartRestoresControlPlane(t *testing.T) {
	dp := agenttest.NewMemoryDatapath()
	dir := t.TempDir()
	a := newCtlAgent(t, dir, dp)
	addLocal(t, a, 1, "10.244.1.2", "shop", "web-a", map[string]string{"app": "web"})
	// A service that the restarted agent will no longer have: its frontend
	// is in the datapath but not in the store (deleted while the datapath
	// kept forwarding, e.g. an older agent version's object). It takes the
	// first frontend ID, so a restart that re-allocated IDs instead of
	// re-adopting them would give shop/web other IDs.
	if err := a.UpsertObjects(decodeObjs(t, "apiVersion: v1\nkind: Service\nmetadata: {name: gone, namespace: shop}\nspec: {clusterIP: 10.96.0.99, ports: [{port: 53}]}\n")); err != nil {
		t.Fatal(err)
	}
	if err := a.UpsertObjects(decodeObjs(t, ctlServices+"---\n"+ctlPolicy+"---\n"+webPod)); err != nil {
		t.Fatal(err)
	}
	if err := a.st.Update(func(tx *store.Tx) error {
		return tx.Delete(store.Objects, []byte(k8sobj.ObjectKey(k8sobj.KindService, "shop", "gone")))
	}); err != nil {
		t.Fatal(err)
	}
	// A remote pod deleted while the agent is down (the store loses it, the
	// pinned maps still hold its ipcache entry).
	if err := a.st.Update(func(tx *store.Tx) error {
		return tx.Delete(store.Objects, []byte(k8sobj.ObjectKey(k8sobj.KindPod, "shop", "other-remote")))
	}); err != nil {
		t.Fatal(err)
	}
	if _, ok := dp.IdentityOf(netip.MustParseAddr("10.244.2.10")); !ok {
		t.Fatal("other-remote not in the ipcache before the restart")
	}
	ids := frontendIDs(a)
	webID, _ := dp.IdentityOf(netip.MustParseAddr("10.244.1.2"))
	clientID, _ := dp.IdentityOf(netip.MustParseAddr("10.244.2.9"))
	if !dp.Allowed(netip.MustParseAddr("10.244.2.9"), netip.MustParseAddr("10.244.1.2"), policy.ProtoTCP, 8080) ||
		dp.Allowed(netip.MustParseAddr("10.244.2.10"), netip.MustParseAddr("10.244.1.2"), policy.ProtoTCP, 8080) {
		t.Fatal("policy verdicts wrong before restart")
	}
	a.st.Close()

	// Restart against the same (pinned) datapath.
	b := newCtlAgent(t, dir, dp)
	if _, ok := dp.IdentityOf(netip.MustParseAddr("10.244.2.10")); ok {
		t.Error("ipcache entry of a pod gone while the agent was down survived the restart")
	}
	if got := len(b.Objects("")); got != 6 {
		t.Fatalf("restored %d objects, want 6", got)
	}
	for k, id := range frontendIDs(b) {
		if ids[k] != id {
			t.Errorf("frontend %v: id %d after restart, was %d", k, id, ids[k])
		}
	}
	if _, ok := dp.Resolve(svcKey("10.96.0.99", 53, service.ScopeClusterIP), 1); ok {
		t.Error("stale frontend 10.96.0.99:53 still programmed after restart")
	}
	svcs, _, _, revnat := dp.ServiceEntries()
	if svcs != 2 || revnat != 2 {
		t.Errorf("after restart: %d services, %d rev-nat entries, want 2 and 2", svcs, revnat)
	}
	if id, _ := dp.IdentityOf(netip.MustParseAddr("10.244.1.2")); id != webID {
		t.Errorf("web identity %d after restart, was %d", id, webID)
	}
	if id, _ := dp.IdentityOf(netip.MustParseAddr("10.244.2.9")); id != clientID {
		t.Errorf("client identity %d after restart, was %d", id, clientID)
	}
	// New label sets get fresh identities, not reused ones.
	addLocal(t, b, 2, "10.244.1.7", "shop", "new", map[string]string{"app": "new"})
	if id, _ := dp.IdentityOf(netip.MustParseAddr("10.244.1.7")); id == webID || id == clientID || id == 0 {
		t.Errorf("new endpoint got identity %d (web %d, client %d)", id, webID, clientID)
	}
	if !dp.Allowed(netip.MustParseAddr("10.244.2.9"), netip.MustParseAddr("10.244.1.2"), policy.ProtoTCP, 8080) ||
		dp.Allowed(netip.MustParseAddr("10.244.2.77"), netip.MustParseAddr("10.244.1.2"), policy.ProtoTCP, 8080) {
		t.Error("policy verdicts differ after restart")
	}
}

func TestEndpointChangesRecompilePolicy(t *testing.T) {
	dp := agenttest.NewMemoryDatapath()
	a := newCtlAgent(t, t.TempDir(), dp)
	if err := a.UpsertObjects(decodeObjs(t, ctlPolicy)); err != nil {
		t.Fatal(err)
	}
	web := netip.MustParseAddr("10.244.1.2")
	client := netip.MustParseAddr("10.244.2.9")
	other := netip.MustParseAddr("10.244.2.10")
	if _, ok := dp.IdentityOf(web); ok {
		t.Fatal("identity before the endpoint exists")
	}
	// CNI ADD with labels in the args: isolated at once (no Pod object yet);
	// the policy's named port is unknown without the Pod, so nothing is allowed.
	addLocal(t, a, 1, "10.244.1.2", "shop", "web-a", map[string]string{"app": "web"})
	if _, ok := dp.IdentityOf(web); !ok {
		t.Fatal("endpoint add did not reach the ipcache")
	}
	if dp.Allowed(other, web, policy.ProtoTCP, 8080) {
		t.Error("new endpoint not isolated by the policy selecting it")
	}
	info, _ := a.PolicyInfoOf(1)
	if info.FromPod || info.Labels["app"] != "web" {
		t.Errorf("info from CNI args: %+v", info)
	}
	// A Pod object overrides the CNI args: other labels, no longer selected.
	if err := a.UpsertObjects(decodeObjs(t, "apiVersion: v1\nkind: Pod\nmetadata: {name: web-a, namespace: shop, labels: {app: db}}\nstatus: {podIP: 10.244.1.2}\n")); err != nil {
		t.Fatal(err)
	}
	if !dp.Allowed(other, web, policy.ProtoTCP, 8080) {
		t.Error("Pod object labels did not override the CNI args")
	}
	if info, _ := a.PolicyInfoOf(1); !info.FromPod || info.Labels["app"] != "db" {
		t.Errorf("info from Pod: %+v", info)
	}
	// CNI DEL: gone from the ipcache.
	delLocal(t, a, "web-a")
	if _, ok := dp.IdentityOf(web); ok {
		t.Error("endpoint del left its ipcache entry")
	}
	if _, ok := a.PolicyInfoOf(1); ok {
		t.Error("policy info of a deleted endpoint")
	}
	_ = client
}

func TestReplaceAndDeleteObjects(t *testing.T) {
	dp := agenttest.NewMemoryDatapath()
	a := newCtlAgent(t, t.TempDir(), dp)
	if err := a.UpsertObjects(decodeObjs(t, ctlServices+"---\n"+ctlPolicy)); err != nil {
		t.Fatal(err)
	}
	keep := decodeObjs(t, ctlPolicy)[1] // client-remote
	if rs, err := a.ReplaceObjects(k8sobj.KindPod, []k8sobj.Object{keep}); err != nil || len(rs) != 0 {
		t.Fatal(rs, err)
	}
	pods := a.Objects(k8sobj.KindPod)
	if len(pods) != 1 || pods[0].Name() != "client-remote" {
		t.Fatalf("pods after replace: %v", pods)
	}
	if _, ok := dp.IdentityOf(netip.MustParseAddr("10.244.2.10")); ok {
		t.Error("replaced-away pod still in the ipcache")
	}
	if _, ok := dp.IdentityOf(netip.MustParseAddr("10.244.2.9")); !ok {
		t.Error("kept pod missing from the ipcache")
	}
	if len(a.Objects(k8sobj.KindService)) != 1 {
		t.Error("replace of pods touched services")
	}
	// A replace with an object of another kind is rejected whole.
	if rs, err := a.ReplaceObjects(k8sobj.KindPod, decodeObjs(t, ctlServices)); !errors.Is(err, ErrInvalid) || rs != nil {
		t.Errorf("replace pods with services: %v, %v", rs, err)
	}
	// Replacing slices with none empties the service's backends.
	if _, err := a.ReplaceObjects(k8sobj.KindEndpointSlice, nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := dp.Resolve(svcKey("10.96.0.10", 80, service.ScopeClusterIP), 1); ok {
		t.Error("service still has backends after its slices were replaced away")
	}
	if _, backends, _, _ := dp.ServiceEntries(); backends != 0 {
		t.Errorf("%d backends left", backends)
	}
	// Delete is idempotent; deleting the service removes its frontends.
	for range 2 {
		if err := a.DeleteObject(k8sobj.KindService, "shop", "web"); err != nil {
			t.Fatal(err)
		}
	}
	if svcs, _, _, revnat := dp.ServiceEntries(); svcs != 0 || revnat != 0 {
		t.Errorf("after delete: %d services %d rev-nat", svcs, revnat)
	}
	if err := a.DeleteObject("Namespace", "ignored", "shop"); err != nil {
		t.Fatal(err)
	}
	if len(a.Objects(k8sobj.KindNamespace)) != 0 {
		t.Error("namespace not deleted")
	}
	if err := a.DeleteObject("Deployment", "shop", "x"); !errors.Is(err, ErrInvalid) {
		t.Errorf("delete of unknown kind: %v", err)
	}
	err := a.st.View(func(tx *store.Tx) error {
		n, err := tx.Count(store.Objects)
		if n != 2 { // the client-remote pod and the policy
			t.Errorf("%d stored objects, want 2", n)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestDatapathFailureIsRetried(t *testing.T) {
	dp := agenttest.NewMemoryDatapath()
	a := newCtlAgent(t, t.TempDir(), dp)
	dp.SetFailApply(true)
	err := a.UpsertObjects(decodeObjs(t, ctlServices))
	if err == nil || !errors.Is(err, agenttest.ErrInjected) {
		t.Fatalf("err = %v, want the datapath failure", err)
	}
	if len(a.Objects("")) != 2 {
		t.Fatal("objects not kept after a datapath failure")
	}
	// A refused update is split until its refused frontends are alone: the
	// ClusterIP and the NodePort frontend (one node address).
	if st := a.ControlStats(); st.PendingSvc != 2 {
		t.Errorf("pending service update parts: %d, want 2", st.PendingSvc)
	}
	dp.SetFailApply(false)
	a.MaintainOnce()
	if _, ok := dp.Resolve(svcKey("10.96.0.10", 80, service.ScopeClusterIP), 1); !ok {
		t.Error("retry did not program the service")
	}
	if st := a.ControlStats(); st.PendingSvc != 0 || st.GCRuns != 1 || dp.GCCalls() != 1 {
		t.Errorf("after maintenance: %+v, gc calls %d", st, dp.GCCalls())
	}
}

const webPod = `
apiVersion: v1
kind: Pod
metadata: {name: web-a, namespace: shop, labels: {app: web}}
spec: {containers: [{name: c, image: x, ports: [{name: http, containerPort: 8080}]}]}
status: {podIP: 10.244.1.2}
`

// TestRestoreDropsStoredPolicyThatNoLongerValidates: the agent compiles its
// policies without validating them again (policyInput: each was validated
// when taken), so a stored policy that this build would refuse — written by
// an older, laxer build, or edited on disk — is dropped at restore instead
// of reaching the compiler (where an unparsable ipBlock would panic); the
// valid ones are restored and enforced.
func TestRestoreDropsStoredPolicyThatNoLongerValidates(t *testing.T) {
	dp := agenttest.NewMemoryDatapath()
	dir := t.TempDir()
	a := newCtlAgent(t, dir, dp)
	addLocal(t, a, 1, "10.244.1.2", "shop", "web-a", map[string]string{"app": "web"})
	if err := a.UpsertObjects(decodeObjs(t, ctlPolicy+"---\n"+webPod)); err != nil {
		t.Fatal(err)
	}
	bad := decodeObjs(t, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-block, namespace: shop}
spec:
  podSelector: {}
  ingress: [{from: [{ipBlock: {cidr: 10.200.0.0/16}}]}]
`)
	if err := a.UpsertObjects(bad); err != nil {
		t.Fatal(err)
	}
	key := []byte(bad[0].Key())
	if err := a.st.Update(func(tx *store.Tx) error {
		var raw map[string]any
		if ok, err := tx.Get(store.Objects, key, &raw); err != nil || !ok {
			t.Fatalf("stored policy: %v (found %v)", err, ok)
		}
		edited := strings.Replace(mustJSON(t, raw), "10.200.0.0/16", "10.200.0.0/99", 1)
		if !strings.Contains(edited, "/99") {
			t.Fatalf("stored policy does not hold its ipBlock: %s", edited)
		}
		return tx.Put(store.Objects, key, json.RawMessage(edited))
	}); err != nil {
		t.Fatal(err)
	}
	a.st.Close()

	b := newCtlAgent(t, dir, dp)
	objs := b.Objects(k8sobj.KindNetworkPolicy)
	if len(objs) != 1 || objs[0].NetworkPolicy.Name != "web-from-clients" {
		t.Fatalf("restored policies %v, want web-from-clients alone", objs)
	}
	if !dp.Allowed(netip.MustParseAddr("10.244.2.9"), netip.MustParseAddr("10.244.1.2"), policy.ProtoTCP, 8080) ||
		dp.Allowed(netip.MustParseAddr("10.244.2.10"), netip.MustParseAddr("10.244.1.2"), policy.ProtoTCP, 8080) {
		t.Fatal("restored policy not enforced")
	}
	if err := b.st.View(func(tx *store.Tx) error {
		if ok, _ := tx.Has(store.Objects, key); ok {
			t.Error("the invalid stored policy is still in the store")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDeleteObjectsOneCommit: DeleteObjects removes several objects at once
// (gone from the agent, the store and the datapath's verdicts), skips what
// is not there, and refuses a batch with an invalid reference whole.
func TestDeleteObjectsOneCommit(t *testing.T) {
	dp := agenttest.NewMemoryDatapath()
	a := newCtlAgent(t, t.TempDir(), dp)
	addLocal(t, a, 1, "10.244.1.2", "shop", "web-a", map[string]string{"app": "web"})
	if err := a.UpsertObjects(decodeObjs(t, ctlServices+"---\n"+ctlPolicy+"---\n"+webPod)); err != nil {
		t.Fatal(err)
	}
	client, web := netip.MustParseAddr("10.244.2.9"), netip.MustParseAddr("10.244.1.2")
	if !dp.Allowed(client, web, policy.ProtoTCP, 8080) || dp.Allowed(netip.MustParseAddr("10.244.2.10"), web, policy.ProtoTCP, 8080) {
		t.Fatal("policy verdicts wrong before the deletes")
	}
	before := len(a.Objects(""))
	err := a.DeleteObjects([]ObjectRef{{Kind: k8sobj.KindNetworkPolicy, Namespace: "shop", Name: "web-from-clients"}, {Kind: "Gadget", Name: "x"}})
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("a batch with an unknown kind: %v, want ErrInvalid", err)
	}
	if len(a.Objects(k8sobj.KindNetworkPolicy)) != 1 {
		t.Fatal("a refused batch deleted its valid reference")
	}
	refs := []ObjectRef{
		{Kind: k8sobj.KindNetworkPolicy, Namespace: "shop", Name: "web-from-clients"},
		{Kind: k8sobj.KindPod, Namespace: "shop", Name: "client-remote"},
		{Kind: k8sobj.KindService, Namespace: "shop", Name: "never-there"},
	}
	if err := a.DeleteObjects(refs); err != nil {
		t.Fatal(err)
	}
	if got := len(a.Objects("")); got != before-2 {
		t.Fatalf("%d objects after deleting 2 of %d", got, before)
	}
	if !dp.Allowed(netip.MustParseAddr("10.244.2.10"), web, policy.ProtoTCP, 8080) {
		t.Error("web is still isolated after its policy was deleted")
	}
	if _, ok := dp.IdentityOf(client); ok {
		t.Error("the deleted remote pod is still in the ipcache")
	}
	if err := a.st.View(func(tx *store.Tx) error {
		for _, r := range refs[:2] {
			if ok, _ := tx.Has(store.Objects, []byte(k8sobj.ObjectKey(r.Kind, r.Namespace, r.Name))); ok {
				t.Errorf("%s/%s still stored", r.Kind, r.Name)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteObjects(refs); err != nil {
		t.Fatalf("deleting them again: %v", err)
	}
}

// TestRestoreObjectHook: at a restart every stored object goes through
// Config.RestoreObject (the Kubernetes source's interning) before the agent
// keeps it, and the agent keeps what the hook left.
func TestRestoreObjectHook(t *testing.T) {
	dp := agenttest.NewMemoryDatapath()
	dir := t.TempDir()
	a := newCtlAgent(t, dir, dp)
	if err := a.UpsertObjects(decodeObjs(t, ctlServices+"---\n"+ctlPolicy+"---\n"+webPod)); err != nil {
		t.Fatal(err)
	}
	stored := len(a.Objects(""))
	a.st.Close()
	seen := map[string]bool{}
	marked := map[string]string{"restored": "yes"}
	b := newCtlAgentWith(t, dir, dp, func(c *Config) {
		c.RestoreObject = func(o *k8sobj.Object) {
			seen[o.Key()] = true
			if o.Pod != nil {
				o.Pod.Labels = marked
			}
		}
	})
	if len(seen) != stored || stored == 0 {
		t.Fatalf("RestoreObject saw %d objects, the store held %d", len(seen), stored)
	}
	for _, o := range b.Objects(k8sobj.KindPod) {
		if o.Pod.Labels["restored"] != "yes" {
			t.Errorf("pod %s: the agent kept the object as decoded, not as RestoreObject left it", o)
		}
	}
}
