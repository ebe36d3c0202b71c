package agent

import (
	"testing"

	"github.com/lanekit/lanekit/internal/agenttest"
)

// FuzzApplyObjects feeds arbitrary bytes through ApplyObjects: it must never
// crash, and a rejected input must leave the objects, the store and the
// datapath maps exactly as they were.
func FuzzApplyObjects(f *testing.F) {
	for _, s := range []string{ctlServices, ctlPolicy, webPod, ctlServices + "---\n" + ctlPolicy,
		ctlPolicy + "---\napiVersion: v1\nkind: Service\nmetadata: {name: x, namespace: shop}\nspec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80}]}\n",
		"{\"apiVersion\":\"v1\",\"kind\":\"Namespace\",\"metadata\":{\"name\":\"a\"}}", "", "---", "kind: List\napiVersion: v1\nitems: []\n"} {
		f.Add([]byte(s))
	}
	dp := agenttest.NewMemoryDatapath()
	a := newCtlAgent(f, f.TempDir(), dp)
	addLocal(f, a, 1, "10.244.1.2", "shop", "web-a", map[string]string{"app": "web"})
	f.Fuzz(func(t *testing.T, data []byte) {
		before := snapshotState(t, a, dp)
		objs, err := a.ApplyObjects(data)
		if err != nil {
			if objs != nil {
				t.Fatalf("objects returned with error %v", err)
			}
			if after := snapshotState(t, a, dp); after != before {
				t.Fatalf("rejected input (%v) changed the state:\n%s\n---- was ----\n%s", err, after, before)
			}
			return
		}
		if len(a.Objects("")) < len(objs) {
			t.Fatalf("applied %d objects, agent holds %d", len(objs), len(a.Objects("")))
		}
	})
}
