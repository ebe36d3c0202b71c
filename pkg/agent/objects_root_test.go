package agent

import (
	"net/netip"
	"testing"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
	"github.com/lanekit/lanekit/pkg/policy"
)

// TestCNIAddDelRecompilesPolicy: a real CNI ADD (devices in namespaces) puts
// the new endpoint into the policy maps with the identity of its CNI-args
// namespace/labels, isolated by a policy already applied; DEL removes it.
// A restart keeps identities and verdicts.
func TestCNIAddDelRecompilesPolicy(t *testing.T) {
	fx := newFixture(t)
	dp := agenttest.NewMemoryDatapath()
	a := fx.start(t, dp)
	if err := a.UpsertObjects(decodeObjs(t, "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: shop}\nspec: {podSelector: {matchLabels: {app: web}}}\n")); err != nil {
		t.Fatal(err)
	}
	pod := netnstest.New(t, "polpod")
	ep, err := a.Add(AddRequest{ContainerID: "c1", IfName: "eth0", Netns: pod.Path(),
		Labels: map[string]string{ArgPodNamespace: "shop", ArgPodName: "web-1", ArgLabelPrefix + "app": "web"}})
	if err != nil {
		t.Fatal(err)
	}
	id, ok := dp.IdentityOf(ep.IP)
	if !ok {
		t.Fatal("ADD did not put the endpoint into the ipcache")
	}
	outside := netip.MustParseAddr("192.0.2.1")
	if dp.Allowed(outside, ep.IP, policy.ProtoTCP, 80) {
		t.Error("new endpoint not isolated by the policy selecting its CNI-args labels")
	}
	if info, ok := a.PolicyInfoOf(ep.ID); !ok || info.Namespace != "shop" || info.Name != "web-1" || info.Identity != uint32(id) {
		t.Errorf("policy info %+v %v (identity %d)", info, ok, id)
	}
	a.Close()
	a = fx.start(t, dp)
	if id2, _ := dp.IdentityOf(ep.IP); id2 != id || dp.Allowed(outside, ep.IP, policy.ProtoTCP, 80) {
		t.Errorf("after restart: identity %d (was %d), allowed %v", id2, id, dp.Allowed(outside, ep.IP, policy.ProtoTCP, 80))
	}
	if _, err := a.Del("c1", "eth0"); err != nil {
		t.Fatal(err)
	}
	if _, ok := dp.IdentityOf(ep.IP); ok {
		t.Error("DEL left the endpoint in the ipcache")
	}
	a.Close()
}
