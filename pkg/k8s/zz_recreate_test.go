package k8s

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestZZDeleteRecreateSameNames(t *testing.T) {
	e := newEnv(t)
	sink := newObjectStore()
	src, _ := run(t, Config{NodeName: "n", Client: e.c, Objects: sink})
	eventually(t, "initial sync", func() bool { return src.Synced() == nil })
	const n = 1500
	par := func(f func(i int)) {
		var wg sync.WaitGroup
		ch := make(chan int)
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range ch {
					f(i)
				}
			}()
		}
		for i := range n {
			ch <- i
		}
		close(ch)
		wg.Wait()
	}
	par(func(i int) {
		mustCreate(t, e.c.CoreV1().Services("default").Create, clusterIPService(fmt.Sprintf("s-%d", i), fmt.Sprintf("10.96.%d.%d", 10+i/200, 1+i%200), 80))
	})
	eventually(t, "created", func() bool { return sink.has(fmt.Sprintf("Service/default/s-%d", n-1)) })
	par(func(i int) {
		if err := e.c.CoreV1().Services("default").Delete(context.Background(), fmt.Sprintf("s-%d", i), metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	})
	par(func(i int) {
		mustCreate(t, e.c.CoreV1().Services("default").Create, clusterIPService(fmt.Sprintf("s-%d", i), fmt.Sprintf("10.96.%d.%d", 30+i/200, 1+i%200), 80))
	})
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		missing := 0
		for i := range n {
			o, ok := sink.get(fmt.Sprintf("Service/default/s-%d", i))
			if !ok || o.Service.Spec.ClusterIP != fmt.Sprintf("10.96.%d.%d", 30+i/200, 1+i%200) {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		time.Sleep(500 * time.Millisecond)
		if time.Now().After(deadline) {
			t.Fatalf("%d services missing or stale", missing)
		}
	}
	t.Fatal("timeout")
}
