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

// InstallKubeVirtCRD installs the VirtualMachineInstance CRD with a minimal
// schema (fields preserved as given; the status subresource like KubeVirt's)
// and waits until it is served. No KubeVirt controller runs: tests write VMI
// status themselves, as virt-handler would.
func InstallKubeVirtCRD(ctx context.Context, cfg *rest.Config) error {
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": "virtualmachineinstances.kubevirt.io"},
		"spec": map[string]any{
			"group": "kubevirt.io",
			"scope": "Namespaced",
			"names": map[string]any{
				"plural": "virtualmachineinstances", "singular": "virtualmachineinstance",
				"kind": "VirtualMachineInstance", "listKind": "VirtualMachineInstanceList",
				"shortNames": []any{"vmi", "vmis"},
			},
			"versions": []any{map[string]any{
				"name": "v1", "served": true, "storage": true,
				"subresources": map[string]any{"status": map[string]any{}},
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type":                                 "object",
					"x-kubernetes-preserve-unknown-fields": true,
				}},
			}},
		},
	}}
	if _, err := dc.Resource(CRDResource).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create VMI CRD: %w", err)
	}
	// Established, then listable through the new endpoint.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := dc.Resource(VMIResource).Namespace("default").List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("VMI CRD not served: %w", err)
	}
	return nil
}
