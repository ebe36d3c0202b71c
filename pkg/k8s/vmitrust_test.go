package k8s

import (
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// TestPodAddrIndexBuckets: the source's pods-by-address index holds a
// bounded number of values however many pods it indexes (a value per
// address was a map per pod), and Holding still answers per address: the
// pods holding it, not the other pods of its bucket — a pod IP, a secondary
// network's address, or a terminated pod's address (none).
func TestPodAddrIndexBuckets(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, podAddrIndexers)
	const n = 3 * podAddrBuckets
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}) }
	for i := range n {
		p := pod("default", fmt.Sprintf("p-%d", i), "node-a", nil)
		p.Status.PodIPs = []corev1.PodIP{{IP: addr(i).String()}}
		if err := idx.Add(slimPod(p)); err != nil {
			t.Fatal(err)
		}
	}
	// A launcher pod whose VM network holds 10.250.0.5; a terminated pod
	// that held 10.250.0.6.
	l := vmLauncher("virt-launcher-vm1-a", "node-a", "uid-1", "10.250.0.9", vmLauncherStatus("vhost-user", "10.250.0.5"))
	done := pod("default", "done", "node-a", nil)
	done.Status.PodIPs, done.Status.Phase = []corev1.PodIP{{IP: "10.250.0.6"}}, corev1.PodSucceeded
	for _, p := range []*corev1.Pod{l, done} {
		if err := idx.Add(slimPod(p)); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(idx.ListIndexFuncValues(podAddrIndex)); got > podAddrBuckets {
		t.Errorf("the index holds %d values for %d pods, want at most %d", got, n+2, podAddrBuckets)
	}
	pods := cachedPods{idx}
	for i := range n {
		got := pods.Holding(addr(i))
		if len(got) != 1 || got[0].Name != fmt.Sprintf("p-%d", i) {
			t.Fatalf("Holding(%s) = %d pods (%v), want p-%d", addr(i), len(got), names(got), i)
		}
	}
	for a, want := range map[string][]string{"10.250.0.5": {l.Name}, "10.250.0.9": {l.Name}, "10.250.0.6": nil, "10.251.0.1": nil} {
		if got := names(pods.Holding(netip.MustParseAddr(a))); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("Holding(%s) = %v, want %v", a, got, want)
		}
	}
	// A pod gone is held by nothing.
	if err := idx.Delete(slimPod(l)); err != nil {
		t.Fatal(err)
	}
	if got := pods.Holding(netip.MustParseAddr("10.250.0.5")); len(got) != 0 {
		t.Errorf("after the delete Holding(10.250.0.5) = %v", names(got))
	}
}

func names(pods []*k8sobj.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}
