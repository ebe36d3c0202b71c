package agent

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/service"
)

// The agent finds a Service's EndpointSlices through its index instead of
// a pass over every object: after random upserts, deletes, slices moving
// from one Service to another, refused batches and a replace, the index is
// the one a full pass builds, every Service's backends are those of the
// slices a full pass finds, and a refused change leaves no trace.
func TestSliceIndexFollowsChanges(t *testing.T) {
	a := newCtlAgent(t, t.TempDir(), agenttest.NewMemoryDatapath())
	objs := benchServiceObjects(12)
	if err := a.UpsertObjects(objs); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	slice := func(i int) k8sobj.Object { return objs[2*i+1] }
	for step := range 300 {
		i := rng.IntN(12)
		var err error
		switch op := rng.IntN(6); op {
		case 0: // the slice moves to another Service (a relabel)
			o := slice(i)
			es := o.EndpointSlice.DeepCopy()
			es.ServiceName = fmt.Sprintf("svc-%d", rng.IntN(12))
			err = a.UpsertObjects([]k8sobj.Object{{Kind: k8sobj.KindEndpointSlice, EndpointSlice: es}})
		case 1:
			err = a.DeleteObject(k8sobj.KindEndpointSlice, "bench", fmt.Sprintf("svc-%d-1", i))
		case 2: // a batch of a slice back and an invalid object: all or nothing
			bad := slice((i + 1) % 12)
			bad.EndpointSlice = bad.EndpointSlice.DeepCopy()
			bad.EndpointSlice.Endpoints[0].Addresses = []string{"not-an-address"}
			if err := a.UpsertObjects([]k8sobj.Object{slice(i), bad}); err == nil {
				t.Fatalf("step %d: a batch with an invalid slice was taken", step)
			}
		case 3:
			err = a.UpsertObjects([]k8sobj.Object{slice(i)})
		case 5: // a new Service claiming another's frontend: refused after the in-place edit, which is undone
			svc := objs[2*i].Service.DeepCopy()
			svc.Name = "clash"
			if err := a.UpsertObjects([]k8sobj.Object{{Kind: k8sobj.KindService, Service: svc}}); !errors.Is(err, ErrInvalid) {
				t.Fatalf("step %d: a Service on another's frontend: err %v; want ErrInvalid", step, err)
			}
		case 4: // a second slice of a Service
			o := slice(i)
			es := o.EndpointSlice.DeepCopy()
			es.Name = fmt.Sprintf("svc-%d-2", rng.IntN(12))
			err = a.UpsertObjects([]k8sobj.Object{{Kind: k8sobj.KindEndpointSlice, EndpointSlice: es}})
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("step %d: %v", step, err)
		}
		checkSliceIndex(t, a, fmt.Sprintf("step %d", step))
	}
	var keep []k8sobj.Object
	for _, o := range a.Objects(k8sobj.KindEndpointSlice) {
		if o.Name() != "svc-3-1" {
			keep = append(keep, o)
		}
	}
	if _, err := a.ReplaceObjects(k8sobj.KindEndpointSlice, keep); err != nil {
		t.Fatal(err)
	}
	checkSliceIndex(t, a, "after a replace")
}

func checkSliceIndex(t *testing.T, a *Agent, when string) {
	t.Helper()
	c := a.ctl
	c.mu.Lock()
	defer c.mu.Unlock()
	want := newSliceIndex(c.objs)
	if !maps.EqualFunc(c.slices, want, slices.Equal[[]string]) {
		t.Fatalf("%s: index %v, a full pass finds %v", when, c.slices, want)
	}
	full := splitSlices(c.objs)
	ids := slices.Collect(maps.Keys(full))
	got := c.slices.slicesFor(c.objs, nil, ids)
	for _, id := range ids {
		if !slices.Equal(got[id], full[id]) {
			t.Fatalf("%s: %v's slices %v; a full pass finds %v", when, id, got[id], full[id])
		}
	}
	if _, ok := c.objs[k8sobj.ObjectKey(k8sobj.KindService, "bench", "clash")]; ok {
		t.Fatalf("%s: a refused Service is among the objects", when)
	}
	m, err := c.buildModel(c.objs)
	if err != nil {
		t.Fatalf("%s: the objects do not build: %v", when, err)
	}
	if d := service.Diff(c.model, m); !d.Empty() {
		t.Fatalf("%s: the model differs from a full build: %+v", when, d)
	}
}
