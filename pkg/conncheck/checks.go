package conncheck

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Result of one check.
type Result string

const (
	Pass Result = "pass"
	Fail Result = "FAIL"
	Skip Result = "skip"
)

// Check is one line of the report.
type Check struct {
	Name   string
	Result Result
	Detail string
}

// Report lists the checks in the order they ran.
type Report struct{ Checks []Check }

// Failed counts the failed checks.
func (r Report) Failed() int {
	n := 0
	for _, c := range r.Checks {
		if c.Result == Fail {
			n++
		}
	}
	return n
}

// Print writes the summary table.
func (r Report) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tRESULT\tDETAIL")
	var pass, fail, skip int
	for _, c := range r.Checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, c.Result, c.Detail)
		switch c.Result {
		case Pass:
			pass++
		case Fail:
			fail++
		case Skip:
			skip++
		}
	}
	tw.Flush()
	fmt.Fprintf(w, "%d passed, %d failed, %d skipped\n", pass, fail, skip)
}

func (r *run) add(name string, res Result, detail string) {
	r.report.Checks = append(r.report.Checks, Check{Name: name, Result: res, Detail: detail})
	r.logf("  %-34s %s  %s", name, res, detail)
}

// probe runs one probe in pod; the last error when it never succeeds.
func (r *run) probe(ctx context.Context, pod *corev1.Pod, kind ProbeKind, target string) (string, error) {
	timeout := min(3*time.Second, r.Timeout)
	out, err := r.Runtime.Exec(ctx, pod, []string{"connectivity", "probe", string(kind), target, "--timeout", timeout.String()})
	return strings.TrimSpace(out), err
}

// expect probes until it succeeds (or, want false, until it fails) within
// the check timeout and records the check.
func (r *run) expect(ctx context.Context, name string, pod *corev1.Pod, kind ProbeKind, target string, want bool) bool {
	deadline := time.Now().Add(r.Timeout)
	for {
		out, err := r.probe(ctx, pod, kind, target)
		from := pod.Name
		if pod.Spec.HostNetwork {
			from = "host " + pod.Spec.NodeName
		}
		switch {
		case want && err == nil:
			r.add(name, Pass, fmt.Sprintf("%s -> %s: %s", from, target, out))
			return true
		case !want && err != nil:
			r.add(name, Pass, fmt.Sprintf("%s -> %s refused by policy: %s", from, target, firstLine(err.Error())))
			return true
		case ctx.Err() != nil || time.Now().After(deadline):
			why := "reachable although denied"
			if want {
				why = firstLine(err.Error())
			}
			r.add(name, Fail, fmt.Sprintf("%s -> %s for %s: %s", from, target, r.Timeout, why))
			return false
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

func hostPort(ip string, port int32) string { return net.JoinHostPort(ip, strconv.Itoa(int(port))) }

func nodeIP(n corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

// checks runs every check in order.
func (r *run) checks(ctx context.Context) {
	echo := func(p *corev1.Pod) string { return hostPort(p.Status.PodIP, ServerPort) }
	r.expect(ctx, "pod-to-pod (same node)", r.client, ProbeEcho, echo(r.servers[0]), true)
	if len(r.servers) > 1 {
		r.expect(ctx, "pod-to-pod (across nodes)", r.client, ProbeEcho, echo(r.servers[1]), true)
	} else {
		r.add("pod-to-pod (across nodes)", Skip, "one schedulable node")
	}
	r.expect(ctx, "pod-to-service (ClusterIP)", r.client, ProbeEcho, hostPort(r.cip.Spec.ClusterIP, 80), true)
	np := r.nodePort.Spec.Ports[0].NodePort
	for _, n := range r.nodes {
		r.expect(ctx, "pod-to-service (NodePort "+n.Name+")", r.client, ProbeEcho, hostPort(nodeIP(n), np), true)
	}
	r.expect(ctx, "host-to-service (ClusterIP)", r.host, ProbeEcho, hostPort(r.cip.Spec.ClusterIP, 80), true)
	r.expect(ctx, "host-to-pod", r.host, ProbeEcho, echo(r.servers[len(r.servers)-1]), true)
	for _, check := range []func(context.Context){
		func(ctx context.Context) { r.policyChecks(ctx, echo(r.servers[len(r.servers)-1])) },
		r.dnsCheck,
		func(ctx context.Context) {
			if r.VM {
				r.vmCheck(ctx)
			}
		},
	} {
		if ctx.Err() != nil {
			return
		}
		check(ctx)
	}
}

// policyChecks: a policy allowing the client into the servers keeps it
// reachable; replaced by one allowing nobody, the client is refused;
// removed, it is reachable again.
func (r *run) policyChecks(ctx context.Context, target string) {
	pols := r.Client.NetworkingV1().NetworkPolicies(r.Namespace)
	servers := metav1.LabelSelector{MatchLabels: map[string]string{labelApp: appServer}}
	port := intstr.FromInt32(ServerPort)
	allow := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "allow-client", Namespace: r.Namespace},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: servers, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{labelApp: appClient}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
			}}},
	}
	deny := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-all", Namespace: r.Namespace},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: servers, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
	}
	if _, err := pols.Create(ctx, allow, metav1.CreateOptions{}); err != nil {
		r.add("policy: allow", Fail, "create: "+err.Error())
		return
	}
	r.expect(ctx, "policy: allow (client -> server)", r.client, ProbeEcho, target, true)
	if err := pols.Delete(ctx, allow.Name, metav1.DeleteOptions{}); err != nil {
		r.add("policy: deny", Fail, "delete the allow policy: "+err.Error())
		return
	}
	if _, err := pols.Create(ctx, deny, metav1.CreateOptions{}); err != nil {
		r.add("policy: deny", Fail, "create: "+err.Error())
		return
	}
	r.expect(ctx, "policy: deny (client -> server)", r.client, ProbeEcho, target, false)
	if err := pols.Delete(ctx, deny.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		r.add("policy: removed", Fail, "delete the deny policy: "+err.Error())
		return
	}
	r.expect(ctx, "policy: removed (client -> server)", r.client, ProbeEcho, target, true)
}

// dnsCheck resolves the kubernetes Service's name from the client pod
// when the cluster runs a DNS Service.
func (r *run) dnsCheck(ctx context.Context) {
	const name = "kubernetes.default.svc.cluster.local"
	svc, err := r.Client.CoreV1().Services("kube-system").Get(ctx, "kube-dns", metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		r.add("dns", Skip, "no kube-dns Service in kube-system")
		return
	case err != nil:
		r.add("dns", Fail, "kube-system/kube-dns: "+err.Error())
		return
	}
	if r.expect(ctx, "dns", r.client, ProbeDNS, name, true) {
		return
	}
	// Name the layer that failed: the DNS Service itself over TCP.
	if len(svc.Spec.Ports) > 0 {
		r.expect(ctx, "dns (kube-dns ClusterIP, TCP)", r.client, ProbeReach, hostPort(svc.Spec.ClusterIP, svc.Spec.Ports[0].Port), true)
	}
}
