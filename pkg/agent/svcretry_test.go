package agent

import (
	"errors"
	"fmt"
	"testing"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/service"
)

// retryServices are n ClusterIP Services sN (10.96.7.N:80) with one
// backend each (10.244.7.N), and their slices.
func retryServices(t *testing.T, n int) (svcs, slices []k8sobj.Object) {
	t.Helper()
	for i := range n {
		svcs = append(svcs, decodeObjs(t, fmt.Sprintf(`
apiVersion: v1
kind: Service
metadata: {name: s%d, namespace: shop}
spec: {clusterIP: 10.96.7.%d, ports: [{name: http, port: 80}]}
`, i, i+1))...)
		slices = append(slices, retrySlice(t, i, 1))
	}
	return svcs, slices
}

// retrySlice is Service sI's slice with backends 10.244.7.I+1, and
// 10.244.8.I+1 when there are two.
func retrySlice(t *testing.T, i, backends int) k8sobj.Object {
	t.Helper()
	y := fmt.Sprintf(`
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s%d-1, namespace: shop, labels: {kubernetes.io/service-name: s%d}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.244.7.%d]
`, i, i, i+1)
	if backends == 2 {
		y += fmt.Sprintf("- addresses: [10.244.8.%d]\n", i+1)
	}
	return decodeObjs(t, y)[0]
}

// programmedBackends is how many backends the datapath gives frontend
// 10.96.7.(i+1):80 (0: not programmed).
func programmedBackends(dp *agenttest.MemoryDatapath, i int) int {
	seen := map[string]bool{}
	for h := range uint32(200) {
		b, ok := dp.Resolve(svcKey(fmt.Sprintf("10.96.7.%d", i+1), 80, service.ScopeClusterIP), h)
		if !ok {
			return 0
		}
		seen[b.String()] = true
	}
	return len(seen)
}

// The datapath refuses one frontend of a first full set: the set is the
// agent's (stored), every other frontend is programmed, and only the refused
// frontend's part waits for a retry. Later changes to other frontends go
// through at once; a change to the refused one waits behind its part; when
// the datapath takes it again, the maintenance retry programs both.
func TestRefusedFrontendRetriedAlone(t *testing.T) {
	dp := agenttest.NewMemoryDatapath()
	a := newCtlAgent(t, t.TempDir(), dp)
	const n, bad = 8, 5
	svcs, slices := retryServices(t, n)
	if _, err := a.ReplaceObjects(k8sobj.KindEndpointSlice, slices); err != nil {
		t.Fatal(err)
	}
	refused := svcKey(fmt.Sprintf("10.96.7.%d", bad+1), 80, service.ScopeClusterIP)
	dp.RefuseService(refused, true)
	rs, err := a.ReplaceObjects(k8sobj.KindService, svcs)
	if !errors.Is(err, ErrDatapathPending) || !errors.Is(err, agenttest.ErrInjected) || len(rs) != 0 {
		t.Fatalf("replace with one frontend refused: refusals %v, err %v; want ErrDatapathPending with the datapath's error", rs, err)
	}
	if got := len(a.Objects(k8sobj.KindService)); got != n {
		t.Errorf("%d Services stored, want %d", got, n)
	}
	for i := range n {
		if got, want := programmedBackends(dp, i), map[bool]int{true: 0, false: 1}[i == bad]; got != want {
			t.Errorf("s%d: %d backends programmed, want %d", i, got, want)
		}
	}
	if st := a.ControlStats(); st.PendingSvc != 1 {
		t.Errorf("%d parts queued, want 1 (the refused frontend's)", st.PendingSvc)
	}

	// Another frontend's change applies; the refused one's waits.
	if err := a.UpsertObjects([]k8sobj.Object{retrySlice(t, 2, 2)}); err != nil {
		t.Errorf("s2's change behind s%d's refused part: %v", bad, err)
	}
	if got := programmedBackends(dp, 2); got != 2 {
		t.Errorf("s2: %d backends programmed, want 2", got)
	}
	if err := a.UpsertObjects([]k8sobj.Object{retrySlice(t, bad, 2)}); !errors.Is(err, ErrDatapathPending) {
		t.Errorf("s%d's change: %v, want ErrDatapathPending", bad, err)
	}
	if st := a.ControlStats(); st.PendingSvc != 2 {
		t.Errorf("%d parts queued, want 2 (s%d's refused part and its change)", st.PendingSvc, bad)
	}

	dp.RefuseService(refused, false)
	a.MaintainOnce()
	if st := a.ControlStats(); st.PendingSvc != 0 {
		t.Errorf("%d parts queued after the retry, want 0", st.PendingSvc)
	}
	if got := programmedBackends(dp, bad); got != 2 {
		t.Errorf("s%d after the retry: %d backends programmed, want 2", bad, got)
	}
}
