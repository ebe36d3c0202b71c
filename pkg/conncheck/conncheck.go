// Package conncheck is `lanekit connectivity test`: it deploys its own
// namespace of test pods (a server and a client on one node, a server on
// another, a hostNetwork pod), a ClusterIP and a NodePort Service, and checks
// pod to pod, pod and host to Services, NetworkPolicy allow and deny, DNS
// and (asked for) a KubeVirt VM, each reported pass, fail or skip with why.
// How a probe runs inside a pod is a Runtime's: the pods' exec API on a
// cluster with kubelets, their network namespaces in the netns lab.
package conncheck

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// ManagedBy labels the namespace a run creates; a namespace without it is
// never deleted.
const ManagedBy = "lanekit-conncheck"

// Pod labels.
const (
	labelApp   = "app.kubernetes.io/name"
	appServer  = "conncheck-server"
	appClient  = "conncheck-client"
	appHost    = "conncheck-host"
	serviceCIP = "echo"
	serviceNP  = "echo-nodeport"
)

// Runtime runs probes inside the test pods.
type Runtime interface {
	// Exec runs `lanekit args...` in pod (its network namespace at
	// least) and returns its standard output; the error carries stderr.
	Exec(ctx context.Context, pod *corev1.Pod, args []string) (string, error)
	// Start is called once the pods run: a runtime without containers
	// starts what their containers would run (the echo servers).
	Start(ctx context.Context, pods []*corev1.Pod) error
	// HostNetworkPods says whether the cluster runs hostNetwork pods;
	// without, the host probes Exec on a hostNetwork pod never created.
	HostNetworkPods() bool
	// WritesEndpointSlices: no EndpointSlice controller runs, the check
	// writes its Services' slices itself.
	WritesEndpointSlices() bool
	// Stop ends what Start started.
	Stop()
}

// Options configure a run.
type Options struct {
	Client  kubernetes.Interface
	Dynamic dynamic.Interface // KubeVirt VMIs; nil: the VM check is skipped
	Runtime Runtime
	// Namespace is created by the run and deleted at its end.
	Namespace string
	// Image runs `lanekit connectivity serve` (the agent image has it).
	Image string
	// Lanekit is the CLI's path in Image.
	Lanekit string
	// Timeout bounds each check's wait for the expected outcome.
	Timeout time.Duration
	VM      bool
	// VMImage is the VMI's containerDisk.
	VMImage string
	// VMSpec, when set, is the VMI to start instead (YAML or JSON of a
	// VirtualMachineInstance, e.g. a kernel-boot guest): its name and
	// namespace are the run's; it must have an interface on the lanekit
	// binding.
	VMSpec []byte
	Out    io.Writer
}

func (o *Options) defaults() {
	if o.Namespace == "" {
		o.Namespace = "lanekit-conncheck"
	}
	if o.Image == "" {
		o.Image = "ghcr.io/lanekit/lanekit-agent:v0.1.0"
	}
	if o.Lanekit == "" {
		o.Lanekit = "/opt/lanekit/bin/lanekit"
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.VMImage == "" {
		o.VMImage = "quay.io/kubevirt/cirros-container-disk-demo:latest"
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
}

// Run deploys the test workloads, runs every check and removes the
// namespace again, also when ctx is cancelled (the removal runs on a fresh
// context). The report lists every check; err is a set-up or clean-up
// failure (a failed check is in the report, Report.Failed).
func Run(ctx context.Context, o Options) (rep Report, err error) {
	o.defaults()
	r := &run{Options: o}
	defer func() {
		o.Runtime.Stop()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if cerr := r.cleanup(cctx); cerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up namespace %s: %w", o.Namespace, cerr))
		}
	}()
	if err := r.setup(ctx); err != nil {
		return r.report, err
	}
	r.checks(ctx)
	if ctx.Err() != nil {
		return r.report, fmt.Errorf("interrupted (the checks after it did not run): %w", context.Cause(ctx))
	}
	return r.report, nil
}

// run is one run's state.
type run struct {
	Options
	report   Report
	created  bool // the namespace is ours to delete
	nodes    []corev1.Node
	client   *corev1.Pod
	servers  []*corev1.Pod // one per node (the first on the client's)
	host     *corev1.Pod
	cip      *corev1.Service
	nodePort *corev1.Service
}

func (r *run) logf(format string, args ...any) { fmt.Fprintf(r.Out, format+"\n", args...) }

// deleteServices deletes the namespace's Services (no DeleteCollection
// for them).
func deleteServices(ctx context.Context, c kubernetes.Interface, ns string) error {
	l, err := c.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range l.Items {
		if err := c.CoreV1().Services(ns).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cleanup deletes what the run created, then the namespace, and waits
// until it is gone.
func (r *run) cleanup(ctx context.Context) error {
	if !r.created {
		return nil
	}
	r.logf("cleaning up namespace %s", r.Namespace)
	c := r.Client
	// The pods go first and explicitly: their network is torn down by
	// their kubelet before the namespace's deletion waits on them.
	var errs []error
	// The rest goes explicitly too: without a namespace controller (the
	// netns lab) a finalized namespace would keep them for its next run.
	all := metav1.ListOptions{}
	for what, del := range map[string]func() error{
		"pods":     func() error { return c.CoreV1().Pods(r.Namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, all) },
		"services": func() error { return deleteServices(ctx, c, r.Namespace) },
		"endpointslices": func() error {
			return c.DiscoveryV1().EndpointSlices(r.Namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, all)
		},
		"networkpolicies": func() error {
			return c.NetworkingV1().NetworkPolicies(r.Namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, all)
		},
	} {
		if err := del(); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete %s: %w", what, err))
		}
	}
	if r.Dynamic != nil {
		if err := r.Dynamic.Resource(vmiGVR).Namespace(r.Namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, all); err != nil &&
			!apierrors.IsNotFound(err) && !meta.IsNoMatchError(err) {
			errs = append(errs, fmt.Errorf("delete VMIs: %w", err))
		}
	}
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		l, err := c.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0, nil
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("pods not gone: %w", err))
	}
	if err := c.CoreV1().Namespaces().Delete(ctx, r.Namespace, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return errors.Join(append(errs, err)...)
	}
	err = wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		ns, err := c.CoreV1().Namespaces().Get(ctx, r.Namespace, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err == nil && r.Runtime.WritesEndpointSlices() && len(ns.Spec.Finalizers) > 0 {
			// No namespace controller either (the netns lab's API
			// server runs alone): the namespace is empty, finalize it.
			ns.Spec.Finalizers = nil
			_, _ = c.CoreV1().Namespaces().Finalize(ctx, ns, metav1.UpdateOptions{})
		}
		return false, nil
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("namespace not gone: %w", err))
	}
	return errors.Join(errs...)
}
