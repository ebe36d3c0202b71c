package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/lanekit/lanekit/internal/k8stest"
)

// kustomizeBuild renders the kustomization the way `kubectl apply -k` does.
func kustomizeBuild(t *testing.T) []byte {
	t.Helper()
	return kustomizeBuildDir(t, ".")
}

// kustomizeBuildDir builds the kustomization in dir (an overlay such as lb).
func kustomizeBuildDir(t *testing.T, dir string) []byte {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	out, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func decodeDocs(t *testing.T, data []byte) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatal(err)
		}
		if len(m) > 0 {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
}

type applier struct {
	dc     dynamic.Interface
	mapper meta.RESTMapper
}

// apply server-side applies obj (dry-run when dry), with strict field
// validation like `kubectl apply --server-side --dry-run=server`.
func (a *applier) apply(ctx context.Context, obj *unstructured.Unstructured, dry bool) error {
	gvk := obj.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return err
	}
	data, err := json.Marshal(obj.Object)
	if err != nil {
		return err
	}
	opts := metav1.PatchOptions{FieldManager: "lanekit-deploy-test", Force: new(bool), FieldValidation: "Strict"}
	*opts.Force = true
	if dry {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	var r dynamic.ResourceInterface = a.dc.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		r = a.dc.Resource(m.Resource).Namespace(obj.GetNamespace())
	}
	_, err = r.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, opts)
	return err
}

// TestServerSideDryRun renders deploy/ with kustomize and applies it with
// dryRun=All against a real kube-apiserver (the version go.mod's k8s.io/api
// matches): every object must pass the API server's validation and
// admission; manifests with a typo or an invalid value must not.
func TestServerSideDryRun(t *testing.T) {
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

	docs := decodeDocs(t, kustomizeBuild(t))
	kinds := map[string]bool{}
	for _, d := range docs {
		kinds[d.GetKind()] = true
		// The namespace must exist for the namespaced objects' dry run
		// (as with kubectl): create it for real first.
		if d.GetKind() == "Namespace" {
			if err := a.apply(ctx, d, false); err != nil {
				t.Fatalf("Namespace %s: %v", d.GetName(), err)
			}
		}
	}
	for _, k := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet"} {
		if !kinds[k] {
			t.Errorf("rendered manifests lack a %s", k)
		}
	}
	for _, d := range docs {
		if err := a.apply(ctx, d, true); err != nil {
			t.Errorf("dry-run apply %s %s/%s: %v", d.GetKind(), d.GetNamespace(), d.GetName(), err)
		}
	}
	// Dry run: nothing but the namespace was created.
	dsGVR := schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"}
	if _, err := dc.Resource(dsGVR).Namespace("lanekit-system").Get(ctx, "lanekit-agent", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the dry run created the DaemonSet (get: %v)", err)
	}

	// The guard works: broken variants of the DaemonSet are refused.
	var ds *unstructured.Unstructured
	for _, d := range docs {
		if d.GetKind() == "DaemonSet" {
			ds = d
		}
	}
	if ds == nil {
		t.Fatal("no DaemonSet rendered")
	}
	for _, tc := range []struct {
		name, want string
		breakIt    func(o map[string]any)
	}{
		{"unknown field", "hostNetwrk", func(o map[string]any) {
			spec := o["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
			spec["hostNetwrk"] = true
		}},
		{"invalid port", "containerPort", func(o map[string]any) {
			c := agentContainer(o)
			c["ports"].([]any)[0].(map[string]any)["containerPort"] = int64(70000)
		}},
		{"selector not matching the template", "selector", func(o map[string]any) {
			o["spec"].(map[string]any)["selector"] = map[string]any{"matchLabels": map[string]any{"app": "other"}}
		}},
		{"volume mount without a volume", "volumeMounts", func(o map[string]any) {
			c := agentContainer(o)
			c["volumeMounts"] = append(c["volumeMounts"].([]any), map[string]any{"name": "nope", "mountPath": "/nope"})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := ds.DeepCopy()
			tc.breakIt(bad.Object)
			err := a.apply(ctx, bad, true)
			if err == nil {
				t.Fatal("the API server accepted the broken DaemonSet")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %q", err, tc.want)
			}
		})
	}
}

func agentContainer(o map[string]any) map[string]any {
	spec := o["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	for _, c := range spec["containers"].([]any) {
		if c.(map[string]any)["name"] == "agent" {
			return c.(map[string]any)
		}
	}
	panic("no agent container")
}
