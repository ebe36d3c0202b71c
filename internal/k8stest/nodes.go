package k8stest

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// CreateNodes creates Nodes n0..n(count-1) through c, 16 at a time: Node i
// with the pod CIDR cidr(i) and the InternalIP addr(i) (its status, as
// kubelet writes it). It returns the first error.
func CreateNodes(ctx context.Context, c kubernetes.Interface, count int, cidr, addr func(int) string) error {
	work := make(chan int)
	errs := make(chan error, count)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%d", i)},
					Spec: corev1.NodeSpec{PodCIDR: cidr(i), PodCIDRs: []string{cidr(i)}}}
				out, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
				if err == nil {
					out.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr(i)}}
					_, err = c.CoreV1().Nodes().UpdateStatus(ctx, out, metav1.UpdateOptions{})
				}
				if err != nil {
					errs <- fmt.Errorf("node %d: %w", i, err)
				}
			}
		}()
	}
	for i := range count {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	return <-errs // nil when none
}
