package conncheck

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
)

// setup creates the namespace, the pods and the Services and waits until
// the pods run.
func (r *run) setup(ctx context.Context) error {
	c := r.Client
	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	for _, n := range nodes.Items {
		if ready(n) && !n.Spec.Unschedulable && len(r.nodes) < 2 {
			r.nodes = append(r.nodes, n)
		}
	}
	if len(r.nodes) == 0 {
		return fmt.Errorf("no ready, schedulable node among %d", len(nodes.Items))
	}
	if err := r.createNamespace(ctx); err != nil {
		return err
	}
	pod := func(name, app string, node corev1.Node, hostNet bool) *corev1.Pod {
		args := []string{"connectivity", "serve", "--for", "1h"}
		if !hostNet {
			args = append(args, "--listen", ":"+strconv.Itoa(ServerPort))
		}
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: r.Namespace, Labels: map[string]string{labelApp: app}},
			Spec: corev1.PodSpec{
				NodeName: node.Name, HostNetwork: hostNet, TerminationGracePeriodSeconds: new(int64),
				Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
				Containers: []corev1.Container{{Name: "conncheck", Image: r.Image, Command: append([]string{r.Lanekit}, args...),
					Ports: []corev1.ContainerPort{{Name: "echo", ContainerPort: ServerPort}}}},
			},
		}
	}
	want := []*corev1.Pod{pod("client", appClient, r.nodes[0], false)}
	for i, n := range r.nodes {
		want = append(want, pod("server-"+strconv.Itoa(i+1), appServer, n, false))
	}
	host := pod("host", appHost, r.nodes[0], true)
	host.Spec.Containers[0].Ports = nil
	if r.Runtime.HostNetworkPods() {
		want = append(want, host)
	} else {
		r.host = host
	}
	var created []*corev1.Pod
	for _, p := range want {
		out, err := c.CoreV1().Pods(r.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create pod %s: %w", p.Name, err)
		}
		created = append(created, out)
	}
	if err := r.createServices(ctx); err != nil {
		return err
	}
	r.logf("waiting for %d test pods on %d nodes", len(created), len(r.nodes))
	running := make([]*corev1.Pod, 0, len(created))
	for _, p := range created {
		got, err := r.waitRunning(ctx, p.Name)
		if err != nil {
			return err
		}
		running = append(running, got)
		switch got.Labels[labelApp] {
		case appClient:
			r.client = got
		case appServer:
			r.servers = append(r.servers, got)
		case appHost:
			r.host = got
		}
	}
	if err := r.Runtime.Start(ctx, running); err != nil {
		return fmt.Errorf("start the test servers: %w", err)
	}
	if r.Runtime.WritesEndpointSlices() {
		for _, s := range []*corev1.Service{r.cip, r.nodePort} {
			if err := r.writeSlice(ctx, s); err != nil {
				return err
			}
		}
	}
	return nil
}

func ready(n corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// createNamespace creates the run's namespace; one left by an interrupted
// run (labelled ours) is removed first, any other is refused.
func (r *run) createNamespace(ctx context.Context) error {
	c := r.Client
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.Namespace, Labels: map[string]string{"app.kubernetes.io/managed-by": ManagedBy}}}
	old, err := c.CoreV1().Namespaces().Get(ctx, r.Namespace, metav1.GetOptions{})
	switch {
	case err == nil && old.Labels["app.kubernetes.io/managed-by"] != ManagedBy:
		return fmt.Errorf("namespace %s exists and is not a connectivity test's: pick another with --namespace", r.Namespace)
	case err == nil:
		r.logf("removing namespace %s left by an earlier run", r.Namespace)
		r.created = true
		if err := r.cleanup(ctx); err != nil {
			return err
		}
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("namespace %s: %w", r.Namespace, err)
	}
	if _, err := c.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", r.Namespace, err)
	}
	r.created = true
	r.logf("created namespace %s", r.Namespace)
	return nil
}

func (r *run) createServices(ctx context.Context) error {
	svc := func(name string, t corev1.ServiceType) *corev1.Service {
		return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: r.Namespace},
			Spec: corev1.ServiceSpec{Type: t, Selector: map[string]string{labelApp: appServer},
				Ports: []corev1.ServicePort{{Name: "echo", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(ServerPort)}}},
		}
	}
	var err error
	if r.cip, err = r.Client.CoreV1().Services(r.Namespace).Create(ctx, svc(serviceCIP, corev1.ServiceTypeClusterIP), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create service %s: %w", serviceCIP, err)
	}
	if r.nodePort, err = r.Client.CoreV1().Services(r.Namespace).Create(ctx, svc(serviceNP, corev1.ServiceTypeNodePort), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create service %s: %w", serviceNP, err)
	}
	return nil
}

// writeSlice writes the EndpointSlice the controller would: the servers.
func (r *run) writeSlice(ctx context.Context, s *corev1.Service) error {
	port, proto, name := int32(ServerPort), corev1.ProtocolTCP, "echo"
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name + "-conncheck", Namespace: r.Namespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: s.Name, discoveryv1.LabelManagedBy: ManagedBy}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
	}
	for _, p := range r.servers {
		nodeName, yes := p.Spec.NodeName, true
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.Status.PodIP}, NodeName: &nodeName,
			Conditions: discoveryv1.EndpointConditions{Ready: &yes},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: p.UID}})
	}
	if _, err := r.Client.DiscoveryV1().EndpointSlices(r.Namespace).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("endpointslice for %s: %w", s.Name, err)
	}
	return nil
}

// waitRunning waits until the pod runs with an IP.
func (r *run) waitRunning(ctx context.Context, name string) (*corev1.Pod, error) {
	var p *corev1.Pod
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	err := wait.PollUntilContextCancel(wctx, 300*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var err error
		if p, err = r.Client.CoreV1().Pods(r.Namespace).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return false, nil
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			return false, fmt.Errorf("pod %s ended: %s", name, p.Status.Phase)
		}
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", nil
	})
	if err != nil {
		why := ""
		if p != nil {
			why = fmt.Sprintf(" (phase %s, %s)", p.Status.Phase, p.Status.Message)
			for _, cs := range p.Status.ContainerStatuses {
				if w := cs.State.Waiting; w != nil {
					why += fmt.Sprintf("; container %s waiting: %s %s", cs.Name, w.Reason, w.Message)
				}
			}
		}
		return nil, fmt.Errorf("pod %s/%s not running%s: %w", r.Namespace, name, why, err)
	}
	return p, nil
}
