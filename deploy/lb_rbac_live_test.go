package deploy

import (
	"context"
	"net/netip"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/lanekit/lanekit/internal/k8stest"
	"github.com/lanekit/lanekit/pkg/lbipam"
)

type nopAnnounce struct{}

func (nopAnnounce) Set([]netip.Addr) error { return nil }

// TestLBOverlayRBACIsEnough applies the base and deploy/lb (its RBAC and
// the example pools) for real and runs
// the agent's LB IPAM and L2 announcer with the agent's ServiceAccount: it
// assigns the pool's first address and holds its Leases, and still may not
// change a Service's spec.
func TestLBOverlayRBACIsEnough(t *testing.T) {
	srv := k8stest.StartT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := srv.RESTConfig()
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := &applier{dc: dc, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))}
	docs := append(decodeDocs(t, kustomizeBuild(t)), decodeDocs(t, kustomizeBuildDir(t, "lb"))...)
	for _, d := range docs {
		switch d.GetKind() {
		case "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap":
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
	agent, err := kubernetes.NewForConfig(agentRESTConfig(t, srv, tok.Status.Token))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- lbipam.RunAgent(runCtx, lbipam.AgentConfig{Client: agent, Node: "n1", Namespace: m.sa.Namespace, IPAM: true,
			IPAMLeaseDuration: 2 * time.Second, IPAMRenewDeadline: 1500 * time.Millisecond, IPAMRetryPeriod: 250 * time.Millisecond,
			Announce: nopAnnounce{}})
	}()
	defer func() { stop(); <-done }()

	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(80), Protocol: corev1.ProtocolTCP}}}}
	if _, err := admin.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *corev1.Service
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err = admin.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		return err == nil && len(got.Status.LoadBalancer.Ingress) == 1, nil
	})
	if err != nil || got.Status.LoadBalancer.Ingress[0].IP != "192.0.2.1" {
		t.Fatalf("web not assigned 192.0.2.1 from the example pool with the agent's RBAC: %+v", got.Status)
	}
	for _, name := range []string{"lanekit-lb-ipam", "lanekit-l2-n1"} {
		if _, err := admin.CoordinationV1().Leases(m.sa.Namespace).Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("lease %s: %v", name, err)
		}
	}
	got.Spec.ExternalIPs = []string{"192.0.2.99"}
	if _, err := agent.CoreV1().Services("default").Update(ctx, got, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the agent updated a Service's spec: %v (want Forbidden)", err)
	}
}
