package deploy

import (
	"context"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/lanekit/lanekit/internal/k8stest"
	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/k8s"
	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// countingSink accepts everything (the agent's seam semantics are tested in
// pkg/agent); it only records that objects arrived.
type countingSink struct {
	mu sync.Mutex
	n  map[k8sobj.Kind]int
}

func (s *countingSink) UpsertObjects(objs []k8sobj.Object) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range objs {
		s.n[o.Kind]++
	}
	return nil
}
func (s *countingSink) DeleteObject(k8sobj.Kind, string, string) error { return nil }
func (s *countingSink) DeleteObjects([]agent.ObjectRef) error          { return nil }
func (s *countingSink) ReplaceObjects(kind k8sobj.Kind, objs []k8sobj.Object) ([]agent.Refusal, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n[kind] += len(objs)
	return nil, nil
}

// vmResolver keeps the VMI resolver the source hands the agent.
type vmResolver struct {
	mu sync.Mutex
	r  agent.VMIResolver
}

func (v *vmResolver) SetVMIResolver(r agent.VMIResolver) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.r = r
}

// agentRESTConfig writes token and the API server's CA in kubelet's
// service-account layout and builds the agent's client configuration from it
// with the API server's address given explicitly (k8s.ServiceAccountConfig,
// what lanekitd --k8s-service-host does).
func agentRESTConfig(t *testing.T, srv *k8stest.Server, token string) *rest.Config {
	t.Helper()
	sa := t.TempDir()
	ca, err := os.ReadFile(srv.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string][]byte{"token": []byte(token), "ca.crt": ca, "namespace": []byte("lanekit-system")} {
		if err := os.WriteFile(filepath.Join(sa, name), body, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	u, err := url.Parse(srv.Host())
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := k8s.ServiceAccountConfig(k8s.APIServer{Host: u.Hostname(), Port: u.Port()}, sa)
	if err != nil {
		t.Fatalf("the agent's client config by explicit address: %v", err)
	}
	if cfg.Host != srv.Host() {
		t.Fatalf("client config host %q, want %q", cfg.Host, srv.Host())
	}
	cfg.Dial = srv.RESTConfig().Dial
	return cfg
}

// TestAgentRBACIsEnough applies the manifests' ServiceAccount and RBAC for
// real, then runs the agent's Kubernetes source with that ServiceAccount's
// token, reaching the API server by explicit address as the DaemonSet does
// without kube-proxy: it must sync every kind it watches (VMIs included) and
// read its Node's pod CIDR, and must not be able to write anything.
func TestAgentRBACIsEnough(t *testing.T) {
	srv := k8stest.StartT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := srv.RESTConfig()
	if err := k8stest.InstallKubeVirtCRD(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := &applier{dc: dc, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))}
	for _, d := range decodeDocs(t, kustomizeBuild(t)) {
		switch d.GetKind() {
		case "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding":
			if err := a.apply(ctx, d, false); err != nil {
				t.Fatalf("apply %s %s: %v", d.GetKind(), d.GetName(), err)
			}
		}
	}
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := load(t)
	tok, err := admin.CoreV1().ServiceAccounts(m.sa.Namespace).CreateToken(ctx, m.sa.Name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The agent's client as the DaemonSet makes it without kube-proxy: the
	// API server by explicit address (k8s-service-host/port), the token and
	// CA from the pod's service-account directory (mirrored here).
	saCfg := agentRESTConfig(t, srv, tok.Status.Token)
	c, err := kubernetes.NewForConfig(saCfg)
	if err != nil {
		t.Fatal(err)
	}
	sdc, err := dynamic.NewForConfig(saCfg)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	cidr, err := k8s.WaitPodCIDR(wctx, c, "n1", log)
	wcancel()
	if err != nil || cidr != "10.244.1.0/24" {
		t.Fatalf("the agent's ServiceAccount reads its pod CIDR: %q, %v", cidr, err)
	}
	sink := &countingSink{n: map[k8sobj.Kind]int{}}
	vms := &vmResolver{}
	src, err := k8s.New(k8s.Config{NodeName: "n1", Client: c, Dynamic: sdc, Objects: sink, VMs: vms, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- src.Run(sctx) }()
	defer func() { scancel(); <-done }()
	for deadline := time.Now().Add(30 * time.Second); src.Synced() != nil; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the source never synced with the agent's ServiceAccount: %v (RBAC too narrow?)", src.Synced())
		}
	}
	sink.mu.Lock()
	if sink.n[k8sobj.KindNamespace] == 0 {
		t.Errorf("no namespaces listed: %v", sink.n)
	}
	sink.mu.Unlock()
	// A VM attachment's ADD reads its launcher pod and VMI.
	vmi, err := dc.Resource(k8s.VMIResource).Namespace("default").Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
		"metadata": map[string]any{"name": "vm1", "namespace": "default"},
		"spec":     map[string]any{"domain": map[string]any{"devices": map[string]any{}}},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	launcher, err := admin.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "virt-launcher-vm1-x", Namespace: "default",
			Labels:      map[string]string{"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": string(vmi.GetUID())},
			Annotations: map[string]string{"kubevirt.io/domain": "vm1"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "compute", Image: "x"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vms.mu.Lock()
	resolve := vms.r
	vms.mu.Unlock()
	if resolve == nil {
		t.Fatal("the source set no VMI resolver")
	}
	if info, ok, err := resolve("default", launcher.Name, string(launcher.UID)); err != nil || !ok || info.Name != "vm1" {
		t.Errorf("the agent's ServiceAccount cannot resolve a launcher pod's VMI: %+v %v %v", info, ok, err)
	}
	// The migration follower lists and watches every VMI.
	if _, err := sdc.Resource(k8s.VMIResource).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("the agent's ServiceAccount cannot list VMIs (live migrations): %v", err)
	}
	if w, err := sdc.Resource(k8s.VMIResource).Watch(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("the agent's ServiceAccount cannot watch VMIs (live migrations): %v", err)
	} else {
		w.Stop()
	}
	// Read only: no writes, no secrets.
	_, err = c.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("the agent's ServiceAccount may create pods: %v", err)
	}
	if _, err := c.CoreV1().Secrets(m.sa.Namespace).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the agent's ServiceAccount may list secrets: %v", err)
	}
}
