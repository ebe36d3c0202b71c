package conncheck

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
)

// KubeletRuntime runs probes through the pods' exec API: a cluster with
// real kubelets and container runtimes.
type KubeletRuntime struct {
	Config *rest.Config
	Client kubernetes.Interface
	// Lanekit is the CLI's path in the test image.
	Lanekit string
}

// Exec runs `lanekit args...` in the pod's container.
func (k *KubeletRuntime) Exec(ctx context.Context, pod *corev1.Pod, args []string) (string, error) {
	req := k.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: pod.Spec.Containers[0].Name, Command: append([]string{k.Lanekit}, args...),
			Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(k.Config, "POST", req.URL())
	if err != nil {
		return "", err
	}
	var stdout, stderr bytes.Buffer
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
		return stdout.String(), fmt.Errorf("exec in %s/%s: %w: %s", pod.Namespace, pod.Name, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Start: the containers run the servers.
func (k *KubeletRuntime) Start(context.Context, []*corev1.Pod) error { return nil }

// HostNetworkPods: kubelets run them.
func (k *KubeletRuntime) HostNetworkPods() bool { return true }

// WritesEndpointSlices: the controller manager does.
func (k *KubeletRuntime) WritesEndpointSlices() bool { return false }

// Stop: nothing to stop.
func (k *KubeletRuntime) Stop() {}
