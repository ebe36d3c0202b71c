package k8s

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/lanekit/lanekit/internal/k8stest"
	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/kubevirt"
)

// KubeVirt's labels on a VMI: the node it runs on and, while it migrates,
// the target node. The follower does not select by them; the tests set
// them as KubeVirt does, to show it needs not.
const (
	labelVMINode         = "kubevirt.io/nodeName"
	labelMigrationTarget = "kubevirt.io/migrationTargetNodeName"
)

// fakeVMI is a VMI as the API server returns it: KubeVirt's node labels
// and, when state is set, status.migrationState.
func fakeVMI(labels map[string]string, state map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
		"metadata": map[string]any{"name": "vm1", "namespace": "default", "uid": "6a1b3d5e"},
		"spec": map[string]any{"domain": map[string]any{"devices": map[string]any{
			"interfaces": []any{map[string]any{"name": "fast", "binding": map[string]any{"name": "lanekit"}}}}}},
		"status": map[string]any{"nodeName": "node-a"},
	}}
	u.SetLabels(labels)
	if state != nil {
		u.Object["status"].(map[string]any)["migrationState"] = state
	}
	return u
}

func running() map[string]any {
	return map[string]any{"migrationUid": "mig-1", "sourceNode": "node-a", "sourcePod": "virt-launcher-vm1-aaaaa",
		"targetNode": "node-b", "targetPod": "virt-launcher-vm1-bbbbb", "startTimestamp": "2026-11-26T01:00:00Z"}
}

func TestMigrationOf(t *testing.T) {
	done := running()
	done["completed"], done["endTimestamp"] = true, "2026-11-26T01:00:07Z"
	cases := []struct {
		name, node string
		state      map[string]any
		want       string // role/phase, "" for no migration
		wantErr    string
	}{
		{name: "never migrated", node: "node-a"},
		{name: "source", node: "node-a", state: running(), want: "source/running"},
		{name: "target", node: "node-b", state: running(), want: "target/running"},
		{name: "bystander", node: "node-c", state: running()},
		{name: "completed on target", node: "node-b", state: done, want: "target/completed"},
		{name: "contradiction", node: "node-a", state: map[string]any{"sourceNode": "node-a", "completed": true, "failed": true}, wantErr: "both completed and failed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := migrationOf(fakeVMI(nil, tc.state), tc.node)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			if m != nil {
				got = string(m.Role) + "/" + string(m.Phase())
				if m.Namespace != "default" || m.Name != "vm1" || m.VM != VMName("default", "vm1") || m.UID != "mig-1" ||
					m.SourcePod != "virt-launcher-vm1-aaaaa" || m.TargetPod != "virt-launcher-vm1-bbbbb" ||
					!m.Start.Equal(time.Date(2026, 11, 26, 1, 0, 0, 0, time.UTC)) {
					t.Fatalf("migration %+v", m)
				}
			}
			if got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// migrationLog records what the follower hands the agent.
type migrationLog struct {
	mu  sync.Mutex
	got []agent.VMIMigration
}

func (l *migrationLog) VMIMigrationChanged(m agent.VMIMigration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, m)
}

func (l *migrationLog) phases() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var s []string
	for _, m := range l.got {
		s = append(s, string(m.Role)+"/"+string(m.Phase()))
	}
	return strings.Join(s, ",")
}

func waitPhases(t *testing.T, l *migrationLog, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for l.phases() != want {
		if time.Now().After(deadline) {
			t.Fatalf("sink got %q, want %q", l.phases(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func newFakeDynamic(objs ...runtime.Object) *dynamicfake.FakeDynamicClient {
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{VMIResource: "VirtualMachineInstanceList"}, objs...)
}

// The follower on the target node and on the source node see one
// migration through the API (fake dynamic client): each change once, with
// its role; updates that leave the migration alone say nothing.
func TestMigrationFollower(t *testing.T) {
	dc := newFakeDynamic(fakeVMI(map[string]string{labelVMINode: "node-a"}, nil))
	src, dst := &migrationLog{}, &migrationLog{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	log := slog.New(slog.DiscardHandler)
	for node, sink := range map[string]*migrationLog{"node-a": src, "node-b": dst} {
		f := newMigrationFollower(node, dc, sink, log)
		wg.Go(func() { f.run(ctx) })
	}
	vmis := dc.Resource(VMIResource).Namespace("default")
	update := func(labels map[string]string, state map[string]any) {
		t.Helper()
		cur, err := vmis.Get(ctx, "vm1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		u := fakeVMI(labels, state)
		u.SetResourceVersion(cur.GetResourceVersion())
		if _, err := vmis.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Give the informers their initial list: a VMI with no migration.
	time.Sleep(100 * time.Millisecond)
	if src.phases() != "" || dst.phases() != "" {
		t.Fatalf("no migration yet, got %q / %q", src.phases(), dst.phases())
	}

	both := map[string]string{labelVMINode: "node-a", labelMigrationTarget: "node-b"}
	update(both, running())
	waitPhases(t, src, "source/running")
	waitPhases(t, dst, "target/running")

	// The same migration again (say a condition changed): nothing new.
	update(both, running())
	time.Sleep(100 * time.Millisecond)

	done := running()
	done["completed"], done["endTimestamp"] = true, "2026-11-26T01:00:07Z"
	update(map[string]string{labelVMINode: "node-b"}, done)
	waitPhases(t, src, "source/running,source/completed")
	waitPhases(t, dst, "target/running,target/completed")
	dst.mu.Lock()
	last := dst.got[len(dst.got)-1]
	dst.mu.Unlock()
	if !last.End.Equal(time.Date(2026, 11, 26, 1, 0, 7, 0, time.UTC)) || last.TargetPod != "virt-launcher-vm1-bbbbb" {
		t.Fatalf("completed migration %+v", last)
	}

}

// A VMI deleted (the watch may only say so with its final state) reports
// that state and is forgotten.
func TestMigrationFollowerSeesFinalStateOnDelete(t *testing.T) {
	sink := &migrationLog{}
	f := newMigrationFollower("node-a", newFakeDynamic(), sink, slog.New(slog.DiscardHandler))
	f.observe(fakeVMI(nil, running()), false)
	done := running()
	done["completed"] = true
	f.observe(cache.DeletedFinalStateUnknown{Key: "default/vm1", Obj: fakeVMI(map[string]string{labelVMINode: "node-b"}, done)}, true)
	if got := sink.phases(); got != "source/running,source/completed" {
		t.Fatalf("sink got %q", got)
	}
	if len(f.last) != 0 {
		t.Fatalf("follower keeps %v after the VMI left", f.last)
	}
}

// Without KubeVirt (no VMI resource) the follower says so and waits; it
// does not spin or fail the source.
func TestMigrationFollowerWithoutKubeVirt(t *testing.T) {
	dc := newFakeDynamic()
	lists := 0
	dc.PrependReactor("list", "virtualmachineinstances", func(k8stesting.Action) (bool, runtime.Object, error) {
		lists++
		return true, nil, apierrors.NewNotFound(VMIResource.GroupResource(), "")
	})
	var buf strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &buf, mu: &mu}, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	newMigrationFollower("node-a", dc, &migrationLog{}, log).run(ctx)
	mu.Lock()
	defer mu.Unlock()
	if lists != 1 || !strings.Contains(buf.String(), "not served (no KubeVirt)") {
		t.Fatalf("lists %d, log %q", lists, buf.String())
	}
}

type lockedWriter struct {
	w  *strings.Builder
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// vmsWithMigrations is the agent's two VM seams: the VMI resolver and the
// migration sink (the source starts a follower only for such an agent).
type vmsWithMigrations struct {
	*vmStore
	*migrationLog
}

// TestMigrationFollowerAgainstAPIServer: two nodes' sources on a real API
// server (the VMI CRD with its status subresource, no KubeVirt controller:
// the test writes labels and status as virt-controller/virt-handler do)
// follow one migration from node-a to node-b through their watches.
func TestMigrationFollowerAgainstAPIServer(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if err := k8stest.InstallKubeVirtCRD(ctx, e.srv.RESTConfig()); err != nil {
		t.Fatal(err)
	}
	vmis := e.dc.Resource(VMIResource).Namespace("default")
	vmi := fakeVMI(map[string]string{labelVMINode: "node-a"}, nil)
	if _, err := vmis.Create(ctx, vmi, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sinks := map[string]*migrationLog{"node-a": {}, "node-b": {}, "node-c": {}}
	for node, l := range sinks {
		run(t, Config{NodeName: node, Client: e.c, Dynamic: e.dc, VMs: vmsWithMigrations{&vmStore{}, l}})
	}
	set := func(labels map[string]string, state map[string]any) {
		t.Helper()
		cur, err := vmis.Get(ctx, "vm1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.SetLabels(labels)
		if cur, err = vmis.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := unstructured.SetNestedField(cur.Object, state, "status", "migrationState"); err != nil {
			t.Fatal(err)
		}
		if _, err := vmis.UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	set(map[string]string{labelVMINode: "node-a", labelMigrationTarget: "node-b"}, running())
	waitPhases(t, sinks["node-a"], "source/running")
	waitPhases(t, sinks["node-b"], "target/running")
	done := running()
	done["completed"], done["endTimestamp"] = true, "2026-11-26T01:00:07Z"
	// virt-controller moves the node label to the target as it completes.
	set(map[string]string{labelVMINode: "node-b"}, done)
	waitPhases(t, sinks["node-a"], "source/running,source/completed")
	waitPhases(t, sinks["node-b"], "target/running,target/completed")
	if got := sinks["node-c"].phases(); got != "" {
		t.Errorf("a node outside the migration heard %q", got)
	}
}

// The follower caches every VMI of the cluster, slimmed to what it reads.
func TestSlimVMI(t *testing.T) {
	in := fakeVMI(map[string]string{labelVMINode: "node-a"}, running())
	in.SetResourceVersion("42")
	o, err := slimVMI(in)
	if err != nil {
		t.Fatal(err)
	}
	s := o.(*unstructured.Unstructured)
	if _, ok := s.Object["spec"]; ok || len(s.GetLabels()) != 0 || s.GetName() != "vm1" || s.GetNamespace() != "default" ||
		s.GetUID() != "6a1b3d5e" || s.GetResourceVersion() != "42" {
		t.Fatalf("slim %v", s.Object)
	}
	m, err := migrationOf(s, "node-b")
	if err != nil || m == nil || m.Role != kubevirt.RoleTarget || m.TargetPod != "virt-launcher-vm1-bbbbb" {
		t.Fatalf("slim VMI's migration %+v, %v", m, err)
	}
}

// The source's migration carries the target node's IPv4 InternalIP (where
// the agent hands the address over at the switch-over), once the node is
// known; the node's address appearing later is a change.
func TestMigrationFollowerTargetVia(t *testing.T) {
	sink := &migrationLog{}
	f := newMigrationFollower("node-a", newFakeDynamic(), sink, slog.New(slog.DiscardHandler))
	f.nodes = cache.NewStore(cache.MetaNamespaceKeyFunc)
	f.observe(fakeVMI(nil, running()), false)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "fd00::2"}, {Type: corev1.NodeInternalIP, Address: "192.168.7.2"}}}}
	if err := f.nodes.Add(node); err != nil {
		t.Fatal(err)
	}
	f.observe(fakeVMI(nil, running()), false)
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.got) != 2 || sink.got[0].TargetVia.IsValid() || sink.got[1].TargetVia != netip.MustParseAddr("192.168.7.2") {
		t.Fatalf("sink got %+v: want the running migration without, then with the target's 192.168.7.2", sink.got)
	}
}
