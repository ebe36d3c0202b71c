package deploy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/lanekit/lanekit/internal/k8stest"
	"github.com/lanekit/lanekit/internal/testutil"
)

// helmCLI runs bin/helm (make helm) as a user does, against kubeconfig,
// with its own config and cache directories.
type helmCLI struct {
	t               *testing.T
	bin, kubeconfig string
	env             []string
}

func newHelmCLI(t *testing.T, kubeconfig string) *helmCLI {
	t.Helper()
	dir := os.Getenv("LANEKIT_BIN")
	if dir == "" {
		t.Skip("skipping: LANEKIT_BIN not set (make test sets it to the built bin/, where make helm puts helm)")
	}
	bin := filepath.Join(dir, "helm")
	if _, err := os.Stat(bin); err != nil {
		testutil.MissingDep(t, "no helm CLI (make helm): %v", err)
	}
	home := t.TempDir()
	env := append(os.Environ(), "HELM_CONFIG_HOME="+home+"/config", "HELM_CACHE_HOME="+home+"/cache", "HELM_DATA_HOME="+home+"/data")
	return &helmCLI{t: t, bin: bin, kubeconfig: kubeconfig, env: env}
}

// run runs helm with args in namespace ns and returns its output.
func (h *helmCLI) run(ns string, args ...string) (string, error) {
	cmd := exec.Command(h.bin, append([]string{"--kubeconfig", h.kubeconfig, "-n", ns}, args...)...)
	cmd.Env = h.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		err = fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), err
}

func (h *helmCLI) mustRun(ns string, args ...string) string {
	h.t.Helper()
	out, err := h.run(ns, args...)
	if err != nil {
		h.t.Fatal(err)
	}
	return out
}

// TestHelmInstallUpgradeRollback runs what docs/install.md tells a user
// to, with bin/helm against a real kube-apiserver (no kubelet: the objects,
// not running pods): install into a namespace Helm creates, upgrade
// --reuse-values, rollback, KubeVirt's NAD added and removed, uninstall. And
// namespace.create into a missing namespace is refused, as values.yaml says.
func TestHelmInstallUpgradeRollback(t *testing.T) {
	srv := k8stest.StartT(t)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := srv.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	h := newHelmCLI(t, kubeconfig)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rc := srv.RESTConfig()
	if err := k8stest.InstallNADCRD(ctx, rc); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	const ns = "lanekit-system"

	// The release namespace as a chart object: Helm stores the release in
	// it before it creates any object, so the install fails, whole.
	if out, err := h.run(ns, "install", "lanekit", chartDir, "--set", "namespace.create=true"); err == nil {
		t.Fatalf("install with namespace.create=true into a missing namespace succeeded:\n%s", out)
	} else if !strings.Contains(err.Error(), "not found") {
		t.Errorf("install with namespace.create=true: %v", err)
	} else {
		t.Logf("namespace.create=true without the namespace, refused: %v", err)
	}
	if _, err := cs.AppsV1().DaemonSets(ns).Get(ctx, "lanekit-agent", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the refused install left a DaemonSet: %v", err)
	}

	state := func() (cm map[string]string, ds *appsv1.DaemonSet, nad bool) {
		t.Helper()
		c, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "lanekit-config", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ds, err = cs.AppsV1().DaemonSets(ns).Get(ctx, "lanekit-agent", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = dc.Resource(k8stest.NADResource).Namespace("default").Get(ctx, "lanekit-vm", metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		return c.Data, ds, err == nil
	}

	out := h.mustRun(ns, "install", "lanekit", chartDir, "--create-namespace", "--set", "kubevirt.enabled=true,config.k8sServiceHost=10.0.0.1")
	for _, want := range []string{"REVISION: 1", "lanekit status --wait", "lanekit connectivity test --vm", "kubectl patch kubevirt"} {
		if !strings.Contains(out, want) {
			t.Errorf("install output lacks %q:\n%s", want, out)
		}
	}
	cm, ds, nad := state()
	if cm["routing-mode"] != "native" || cm["k8s-service-host"] != "10.0.0.1" || !nad {
		t.Fatalf("installed: config %v, NAD %v", cm, nad)
	}
	if ds.Labels["app.kubernetes.io/managed-by"] != "Helm" || ds.Spec.Template.Spec.ServiceAccountName != "lanekit-agent" {
		t.Errorf("DaemonSet labels %v", ds.Labels)
	}
	sum1 := ds.Spec.Template.Annotations["checksum/config"]

	// upgrade --reuse-values --set: the new setting reaches the ConfigMap,
	// the old ones stay, and the changed config rolls the agents.
	h.mustRun(ns, "upgrade", "lanekit", chartDir, "--reuse-values", "--set", "config.routingMode=tunnel")
	cm, ds, nad = state()
	if cm["routing-mode"] != "tunnel" || cm["k8s-service-host"] != "10.0.0.1" || !nad {
		t.Errorf("upgraded: config %v, NAD %v", cm, nad)
	}
	if ds.Spec.Template.Annotations["checksum/config"] == sum1 {
		t.Error("the upgrade changed the ConfigMap but not the pod template: the agents would keep the old settings")
	}
	// A refused value leaves the release as it was.
	if _, err := h.run(ns, "upgrade", "lanekit", chartDir, "--reuse-values", "--set", "config.routingMode=vxlan"); err == nil ||
		!strings.Contains(err.Error(), "routingMode") {
		t.Errorf("upgrade to routingMode=vxlan: %v", err)
	}

	h.mustRun(ns, "rollback", "lanekit", "1")
	cm, ds, _ = state()
	if cm["routing-mode"] != "native" || ds.Spec.Template.Annotations["checksum/config"] != sum1 {
		t.Errorf("rolled back: config %v, checksum %q (revision 1: %q)", cm, ds.Spec.Template.Annotations["checksum/config"], sum1)
	}
	if out := h.mustRun(ns, "history", "lanekit"); strings.Count(out, "\n") != 4 || !strings.Contains(out, "Rollback to 1") {
		t.Errorf("history:\n%s", out)
	}

	// KubeVirt off removes the NAD.
	h.mustRun(ns, "upgrade", "lanekit", chartDir, "--reuse-values", "--set", "kubevirt.enabled=false")
	if _, _, nad := state(); nad {
		t.Error("kubevirt.enabled=false left the NetworkAttachmentDefinition")
	}

	h.mustRun(ns, "uninstall", "lanekit")
	if _, err := cs.RbacV1().ClusterRoles().Get(ctx, "lanekit-agent", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("uninstall left the ClusterRole: %v", err)
	}
	if _, err := cs.AppsV1().DaemonSets(ns).Get(ctx, "lanekit-agent", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("uninstall left the DaemonSet: %v", err)
	}
}
