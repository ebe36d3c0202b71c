package k8s

import (
	"context"
	"fmt"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Services deleted and at once created again under the same names, with
// other ClusterIPs, 16 writers at a time (a cleanup and a refill): the deletes
// and creates queue up together behind the worker (deletes in one call, then
// the upserts), and the agent ends with every new version, none missing and
// none stale.
func TestDeleteAndRecreateSameNames(t *testing.T) {
	e := newEnv(t)
	sink := newObjectStore()
	src, _ := run(t, Config{NodeName: "n", Client: e.c, Objects: sink})
	eventually(t, "initial sync", func() bool { return src.Synced() == nil })
	const n = 400
	ip := func(round, i int) string { return fmt.Sprintf("10.96.%d.%d", round+i/200, 1+i%200) }
	each := func(f func(i int)) {
		var wg sync.WaitGroup
		next := make(chan int)
		for range 16 {
			wg.Go(func() {
				for i := range next {
					f(i)
				}
			})
		}
		for i := range n {
			next <- i
		}
		close(next)
		wg.Wait()
	}
	create := func(round int) func(int) {
		return func(i int) {
			mustCreate(t, e.c.CoreV1().Services("default").Create, clusterIPService(fmt.Sprintf("s-%d", i), ip(round, i), 80))
		}
	}
	current := func(round int) func() bool {
		return func() bool {
			for i := range n {
				o, ok := sink.get(fmt.Sprintf("Service/default/s-%d", i))
				if !ok || o.Service.Spec.ClusterIP != ip(round, i) {
					return false
				}
			}
			return true
		}
	}
	each(create(10))
	eventually(t, "the first Services", current(10))
	each(func(i int) {
		if err := e.c.CoreV1().Services("default").Delete(context.Background(), fmt.Sprintf("s-%d", i), metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	})
	each(create(30))
	eventually(t, "every Service at its new ClusterIP", current(30))
}
