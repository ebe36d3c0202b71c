package k8s

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// batchSink is an objectStore that records the size of each UpsertObjects
// call and, when armed, holds the first call of a phase until released:
// the changes made meanwhile queue up behind it.
type batchSink struct {
	*objectStore
	hold  atomic.Pointer[chan struct{}]
	mu    sync.Mutex
	sizes []int
}

func (b *batchSink) UpsertObjects(objs []k8sobj.Object) error {
	if p := b.hold.Swap(nil); p != nil {
		<-*p
	}
	b.mu.Lock()
	b.sizes = append(b.sizes, len(objs))
	b.mu.Unlock()
	return b.objectStore.UpsertObjects(objs)
}

// phase holds the next UpsertObjects, runs changes while it is held, then
// releases it and returns the sizes of the calls made from then on until
// done reports true.
func (b *batchSink) phase(t *testing.T, src *Source, trigger func(), changes func() int, done func() bool) []int {
	t.Helper()
	release := make(chan struct{})
	b.hold.Store(&release)
	trigger()
	eventually(t, "the trigger's upsert held", func() bool { return b.hold.Load() == nil })
	n := changes()
	eventually(t, fmt.Sprintf("%d changes queued", n), func() bool { return src.queue.Len() >= n })
	b.mu.Lock()
	from := len(b.sizes)
	b.mu.Unlock()
	close(release)
	eventually(t, "the queued changes applied", done)
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.sizes[from:])
}

// Changes that queue up while the worker is busy reach the agent in one
// UpsertObjects call (one commit, one store transaction) instead of one
// each; and if one of them is refused, the batch falls back to one call per
// object, so only that object is refused and every other one applies.
func TestQueuedChangesApplyTogether(t *testing.T) {
	e := newEnv(t)
	sink := &batchSink{objectStore: newObjectStore()}
	src, _ := run(t, Config{NodeName: "n", Client: e.c, Objects: sink})
	eventually(t, "initial sync", func() bool { return src.Synced() == nil })

	const n = 30
	create := func(prefix string, base int) func() int {
		return func() int {
			for i := range n {
				mustCreate(t, e.c.CoreV1().Services("default").Create, clusterIPService(fmt.Sprintf("%s-%d", prefix, i), fmt.Sprintf("10.96.%d.%d", base, i+1), 80))
			}
			return n
		}
	}
	all := func(prefix string, except int) func() bool {
		return func() bool {
			for i := range n {
				if sink.has(fmt.Sprintf("Service/default/%s-%d", prefix, i)) != (i != except) {
					return false
				}
			}
			return true
		}
	}
	trigger := func(name, ip string) func() {
		return func() { mustCreate(t, e.c.CoreV1().Services("default").Create, clusterIPService(name, ip, 80)) }
	}

	sizes := sink.phase(t, src, trigger("first", "10.96.9.1"), create("a", 1), all("a", -1))
	if len(sizes) == 0 || slices.Max(sizes) < n {
		t.Errorf("%d queued Services reached the agent in calls of %v objects; want one call with all of them", n, sizes)
	}

	sink.setRefuse("Service/default/b-7", true)
	sizes = sink.phase(t, src, trigger("second", "10.96.9.2"), create("b", 2), all("b", 7))
	if len(sizes) == 0 || slices.Max(sizes) < n || len(sizes) < n {
		t.Errorf("with one refused object the calls were of %v objects; want the batch, then one call per object", sizes)
	}
	if _, ok := src.Refused()["Service default/b-7"]; !ok {
		t.Errorf("the refused Service is not among the source's refusals %v", src.Refused())
	}
}

// Deletes that queue up while the worker is busy reach the agent in one
// DeleteObjects call (one commit: the agent compiles its policies once, not
// once per deleted NetworkPolicy), and the objects are gone.
func TestQueuedDeletesApplyTogether(t *testing.T) {
	e := newEnv(t)
	sink := &batchSink{objectStore: newObjectStore()}
	src, _ := run(t, Config{NodeName: "n", Client: e.c, Objects: sink})
	eventually(t, "initial sync", func() bool { return src.Synced() == nil })

	const n = 30
	for i := range n {
		mustCreate(t, e.c.CoreV1().Services("default").Create, clusterIPService(fmt.Sprintf("d-%d", i), fmt.Sprintf("10.96.3.%d", i+1), 80))
	}
	eventually(t, "the Services applied", func() bool { return sink.has(fmt.Sprintf("Service/default/d-%d", n-1)) })
	trigger := func() {
		mustCreate(t, e.c.CoreV1().Services("default").Create, clusterIPService("trigger", "10.96.9.9", 80))
	}
	deleteAll := func() int {
		for i := range n {
			if err := e.c.CoreV1().Services("default").Delete(t.Context(), fmt.Sprintf("d-%d", i), metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		return n
	}
	gone := func() bool {
		for i := range n {
			if sink.has(fmt.Sprintf("Service/default/d-%d", i)) {
				return false
			}
		}
		return true
	}
	sink.phase(t, src, trigger, deleteAll, gone)
	sink.mu.Lock()
	calls := slices.Clone(sink.deleteCalls)
	sink.mu.Unlock()
	if len(calls) == 0 || slices.Max(calls) < n {
		t.Errorf("%d queued deletes reached the agent in DeleteObjects calls of %v objects; want one call with all of them", n, calls)
	}
}
