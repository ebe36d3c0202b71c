package k8stest

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// CRDResource is apiextensions.k8s.io/v1 customresourcedefinitions.
var CRDResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// VMIResource is KubeVirt's kubevirt.io/v1 virtualmachineinstances.
var VMIResource = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}

// NADResource is Multus' k8s.cni.cncf.io/v1 network-attachment-definitions.
var NADResource = schema.GroupVersionResource{Group: "k8s.cni.cncf.io", Version: "v1", Resource: "network-attachment-definitions"}

// InstallKubeVirtCRD installs the VirtualMachineInstance CRD with a minimal
// schema (fields preserved as given; the status subresource like KubeVirt's)
// and waits until it is served. No KubeVirt controller runs: tests write VMI
// status themselves, as virt-handler would.
func InstallKubeVirtCRD(ctx context.Context, cfg *rest.Config) error {
	return installCRD(ctx, cfg, VMIResource, "VirtualMachineInstance", "virtualmachineinstance", []any{"vmi", "vmis"}, true)
}

// VMIMResource is KubeVirt's kubevirt.io/v1 virtualmachineinstancemigrations.
var VMIMResource = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstancemigrations"}

// InstallKubeVirtMigrationCRD installs KubeVirt's
// VirtualMachineInstanceMigration CRD (every field kept, a status
// subresource) and waits until it is served.
func InstallKubeVirtMigrationCRD(ctx context.Context, cfg *rest.Config) error {
	return installCRD(ctx, cfg, VMIMResource, "VirtualMachineInstanceMigration", "virtualmachineinstancemigration", []any{"vmim"}, true)
}

// InstallNADCRD installs Multus' NetworkAttachmentDefinition CRD (spec.config
// is the CNI configuration as a string) and waits until it is served.
func InstallNADCRD(ctx context.Context, cfg *rest.Config) error {
	return installCRD(ctx, cfg, NADResource, "NetworkAttachmentDefinition", "network-attachment-definition", []any{"net-attach-def"}, false)
}

// installCRD installs a namespaced CRD whose objects keep every field, and
// waits until it is listable.
func installCRD(ctx context.Context, cfg *rest.Config, gvr schema.GroupVersionResource, kind, singular string, short []any, status bool) error {
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	version := map[string]any{
		"name": gvr.Version, "served": true, "storage": true,
		"schema": map[string]any{"openAPIV3Schema": map[string]any{
			"type":                                 "object",
			"x-kubernetes-preserve-unknown-fields": true,
		}},
	}
	if status {
		version["subresources"] = map[string]any{"status": map[string]any{}}
	}
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": gvr.Resource + "." + gvr.Group},
		"spec": map[string]any{
			"group": gvr.Group,
			"scope": "Namespaced",
			"names": map[string]any{
				"plural": gvr.Resource, "singular": singular,
				"kind": kind, "listKind": kind + "List", "shortNames": short,
			},
			"versions": []any{version},
		},
	}}
	if _, err := dc.Resource(CRDResource).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create %s CRD: %w", kind, err)
	}
	// Established, then listable through the new endpoint.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := dc.Resource(gvr).Namespace("default").List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("%s CRD not served: %w", kind, err)
	}
	return nil
}
