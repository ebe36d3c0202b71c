package datapath

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/service"
)

func ptr[T any](v T) *T { return &v }

// cpuTime is the process's user+system CPU time: on a shared machine the
// wall clock also counts waiting for a CPU.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// scaleObjects returns n ClusterIP+NodePort services with `backends` ready
// endpoints each.
func scaleObjects(n, backends int) ([]*k8sobj.Service, []*k8sobj.EndpointSlice) {
	var svcs []*k8sobj.Service
	var eps []*k8sobj.EndpointSlice
	for i := range n {
		name := fmt.Sprintf("s%d", i)
		svcs = append(svcs, k8sobj.SlimService(&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "scale"},
			Spec: corev1.ServiceSpec{
				ClusterIP: fmt.Sprintf("10.96.%d.%d", i/250, i%250+1),
				Ports:     []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
			},
		}))
		es := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "scale", Labels: map[string]string{k8sobj.ServiceNameLabel: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
		}
		for b := range backends {
			j := i*backends + b
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.%d.%d.%d", 100+j/65000, j/250%260, j%250+1)}})
		}
		eps = append(eps, k8sobj.SlimEndpointSlice(es))
	}
	return svcs, eps
}

// TestServiceProgrammingTime programs 10,000 services with 4 backends each
// into fresh maps, then one endpoint change, and checks the datapath side
// against gross bounds (targets: 10k services <= 1 s, one change <= 10 ms,
// judged by the benchmark, not here). The
// translation time (pkg/service) is logged separately.
func TestServiceProgrammingTime(t *testing.T) {
	testutil.RequireBPFFS(t)
	const n, backends = 10000, 4
	pin := filepath.Join("/sys/fs/bpf", fmt.Sprintf("lk-test-%d-scale", os.Getpid()))
	t.Cleanup(func() { Unpin(pin) }) // a failed Open may have pinned some maps
	dp, err := Open(Config{PinDir: pin}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })

	svcs, eps := scaleObjects(n, backends)
	t0 := time.Now()
	m, err := service.Build(svcs, eps, service.Options{NodeAddrs: []netip.Addr{netip.MustParseAddr("192.168.1.1")}})
	if err != nil {
		t.Fatal(err)
	}
	tables := service.NewTables()
	u := tables.Apply(service.Diff(nil, m))
	translate := time.Since(t0)
	t1, c1 := time.Now(), cpuTime()
	if err := dp.ApplyServices(u); err != nil {
		t.Fatal(err)
	}
	apply, applyCPU := time.Since(t1), cpuTime()-c1
	t.Logf("10k services x %d backends: translate %v, ApplyServices %v wall, %v CPU (user+sys) (%s)",
		backends, translate, apply, applyCPU, u)

	// One change: one backend of one service becomes not ready.
	es := eps[1234].DeepCopy()
	es.Endpoints[0].Conditions.Ready = k8sobj.ConditionFalse
	var worst time.Duration
	for i := range 5 {
		if i%2 == 1 {
			es.Endpoints[0].Conditions.Ready = k8sobj.ConditionTrue
		} else {
			es.Endpoints[0].Conditions.Ready = k8sobj.ConditionFalse
		}
		c, err := m.Set(svcs[1234], []*k8sobj.EndpointSlice{es})
		if err != nil {
			t.Fatal(err)
		}
		cu := tables.Apply(c)
		t2 := time.Now()
		if err := dp.ApplyServices(cu); err != nil {
			t.Fatal(err)
		}
		worst = max(worst, time.Since(t2))
	}
	t.Logf("one endpoint change: ApplyServices worst of 5 %v", worst)

	// The targets are the benchmark's to judge (lanekit lab bench, services
	// section): this machine's 2 CPUs are shared, so the bounds below only
	// catch a pathological regression (per-entry grace periods, per-slot
	// syscalls); the log lines carry the measurements.
	// A change that resizes the table (4 -> 5 backends: 401 -> 809 slots)
	// swaps in a new array: one write to the map of maps, which waits for
	// an RCU grace period in the kernel.
	var resize time.Duration
	for i := range 4 {
		es := eps[2000+i].DeepCopy()
		es.Endpoints = append(es.Endpoints, k8sobj.Endpoint{Addresses: []string{fmt.Sprintf("10.200.0.%d", i+1)}})
		c, err := m.Set(svcs[2000+i], []*k8sobj.EndpointSlice{es})
		if err != nil {
			t.Fatal(err)
		}
		cu := tables.Apply(c)
		t2 := time.Now()
		if err := dp.ApplyServices(cu); err != nil {
			t.Fatal(err)
		}
		resize = max(resize, time.Since(t2))
	}
	t.Logf("one change that resizes a Maglev table: ApplyServices worst of 4 %v", resize)
	// The grace period the kernel waits for is outside our control (8-26 ms
	// measured with the 2 CPUs at load 14): only a sanity bound here.
	if resize > 2*time.Second {
		t.Errorf("a resizing change took %v", resize)
	}

	got, err := dp.DumpServices()
	if err != nil {
		t.Fatal(err)
	}
	snap := tables.Snapshot()
	if len(got.Services) != len(snap.Services) || len(got.Backends) != len(snap.Backends) || len(got.Maglev) != len(snap.Maglev) {
		t.Fatalf("dump: %s, programmed %s", got, snap)
	}
	if apply > 20*time.Second {
		t.Errorf("ApplyServices of 10k services took %v (target 1 s, judged by the benchmark)", apply)
	}
	if worst > time.Second {
		t.Errorf("one change took %v (target 10 ms, judged by the benchmark)", worst)
	}
}
