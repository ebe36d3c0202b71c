package service

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// Batch must agree with the copying path: for random edit sets, the model it
// leaves equals Build of the same objects, and its changes equal Diff's.
func TestBatchAgreesWithBuildAndDiff(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	svcs, eps := batchObjects(40, rng)
	m, err := Build(svcs, eps, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for round := range 60 {
		before, err := Build(liveServices(svcs), eps, Options{})
		if err != nil {
			t.Fatal(err)
		}
		var edits []Edit
		for range 1 + rng.IntN(5) {
			i := rng.IntN(len(svcs))
			id := ServiceID{"bench", fmt.Sprintf("svc-%d", i)}
			switch rng.IntN(3) {
			case 0: // removed
				svcs[i] = nil
				edits = append(edits, Edit{ID: id})
			default: // new endpoints
				if svcs[i] == nil {
					svcs[i] = batchService(i)
				}
				eps[i] = batchSlice(i, rng)
				edits = append(edits, Edit{ID: id, Service: svcs[i], Slices: []*k8sobj.EndpointSlice{eps[i]}})
			}
		}
		c, undo, err := m.Batch(edits)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		live := liveServices(svcs)
		want, err := Build(live, eps, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if d := Diff(want, m); !d.Empty() {
			t.Fatalf("round %d: batch model differs from Build: %+v", round, d)
		}
		wc := Diff(before, want)
		if fmt.Sprint(keysOf(c.Upserted), c.Removed) != fmt.Sprint(keysOf(wc.Upserted), wc.Removed) {
			t.Fatalf("round %d: changes %v %v, Diff says %v %v", round, keysOf(c.Upserted), c.Removed, keysOf(wc.Upserted), wc.Removed)
		}
		if round%7 == 3 { // a later step failed: undo restores the model
			undo()
			if d := Diff(before, m); !d.Empty() {
				t.Fatalf("round %d: undo left %+v", round, d)
			}
			m, _ = Build(live, eps, Options{}) // carry on from the new objects
		}
	}
}

// A frontend clash fails the whole batch and leaves the model as it was.
func TestBatchClashChangesNothing(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	svcs, eps := batchObjects(3, rng)
	m, err := Build(svcs, eps, Options{})
	if err != nil {
		t.Fatal(err)
	}
	before, _ := Build(svcs, eps, Options{})
	clash := batchService(1)
	clash.Name = "other"
	edits := []Edit{
		{ID: ServiceID{"bench", "svc-0"}, Service: svcs[0], Slices: []*k8sobj.EndpointSlice{batchSlice(0, rng)}},
		{ID: ServiceID{"bench", "other"}, Service: clash},
	}
	if _, _, err := m.Batch(edits); err == nil {
		t.Fatal("a frontend clash was accepted")
	}
	if d := Diff(before, m); !d.Empty() {
		t.Fatalf("failed batch changed the model: %+v", d)
	}
}

func liveServices(svcs []*k8sobj.Service) []*k8sobj.Service {
	var live []*k8sobj.Service
	for _, s := range svcs {
		if s != nil {
			live = append(live, s)
		}
	}
	return live
}

func mustDecode(y string) k8sobj.Object {
	objs, err := k8sobj.Decode([]byte(y))
	if err != nil {
		panic(err)
	}
	return objs[0]
}

func keysOf(fs []*Frontend) []FrontendKey {
	out := make([]FrontendKey, len(fs))
	for i, f := range fs {
		out[i] = f.Key
	}
	return out
}

func batchObjects(n int, rng *rand.Rand) ([]*k8sobj.Service, []*k8sobj.EndpointSlice) {
	var svcs []*k8sobj.Service
	var eps []*k8sobj.EndpointSlice
	for i := range n {
		svcs = append(svcs, batchService(i))
		eps = append(eps, batchSlice(i, rng))
	}
	return svcs, eps
}

func batchService(i int) *k8sobj.Service {
	y := fmt.Sprintf(`
apiVersion: v1
kind: Service
metadata: {name: svc-%d, namespace: bench}
spec:
  clusterIP: 10.96.1.%d
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
`, i, i+1)
	return mustDecode(y).Service
}

func batchSlice(i int, rng *rand.Rand) *k8sobj.EndpointSlice {
	addrs := ""
	for j := range 1 + rng.IntN(4) {
		addrs += fmt.Sprintf("\n  - addresses: [10.%d.0.%d]", 100+j, i+1)
	}
	y := fmt.Sprintf(`
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: svc-%d-1, namespace: bench, labels: {kubernetes.io/service-name: svc-%d}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:%s
`, i, i, addrs)
	return mustDecode(y).EndpointSlice
}
