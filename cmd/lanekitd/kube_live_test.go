package main

import (
	"context"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lanekit/lanekit/internal/k8stest"
)

// TestPodCIDRByExplicitAPIServer: lanekitd's flags as the DaemonSet passes
// them without kube-proxy (--k8s-service-host/--k8s-service-port of a real
// API server, no KUBERNETES_SERVICE_HOST), with a token and CA in kubelet's
// service-account layout, get the agent its pod CIDR from its Node.
func TestPodCIDRByExplicitAPIServer(t *testing.T) {
	srv := k8stest.StartT(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := kubernetes.NewForConfig(srv.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n7"},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.7.0/24", PodCIDRs: []string{"10.244.7.0/24"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sa := t.TempDir()
	ca, err := os.ReadFile(srv.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(sa, "token"), []byte(srv.Token), 0o600)
	os.WriteFile(filepath.Join(sa, "ca.crt"), ca, 0o600)
	u, err := url.Parse(srv.Host())
	if err != nil {
		t.Fatal(err)
	}
	// Nothing in-cluster to fall back on.
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	k := parseKube(t, "--node-name=n7", "--k8s-service-host="+u.Hostname(), "--k8s-service-port="+u.Port())
	k.saDir = sa
	if err := k.validate(); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
	defer wcancel()
	log := slog.New(slog.DiscardHandler)
	kc, err := k.clients(log)
	if err != nil {
		t.Fatal(err)
	}
	nf, err := k.fromNode(wctx, kc, "", "", false, "", log)
	if err != nil || nf.PodCIDR != "10.244.7.0/24" {
		t.Fatalf("pod CIDR by explicit API server address: %+v, %v", nf, err)
	}
}
