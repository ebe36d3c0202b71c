package lab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// NamedPod is a pod added with `lanekit lab pod add`: a lanekit pod with a
// Kubernetes identity (namespace, name, labels, named ports) that every
// node's agent knows through a Pod object.
type NamedPod struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Node      int               `json:"node"`
	NS        string            `json:"netns"`
	IP        string            `json:"ip"`
	IP6       string            `json:"ip6,omitempty"` // a dual-stack lab's
	Labels    map[string]string `json:"labels,omitempty"`
	Ports     []PodPort         `json:"ports,omitempty"`
}

// PodPort is a named container port.
type PodPort struct {
	Name     string `json:"name"`
	Port     int32  `json:"port"`
	Protocol string `json:"protocol"`
}

// PodOptions describe a pod to add.
type PodOptions struct {
	Name      string
	Node      int // 1-based
	Namespace string
	Labels    map[string]string
	Ports     []PodPort
	Bins      Bins
}

// NamedPodNS is the netns of the named pod.
func NamedPodNS(name string) string { return "lk-p-" + name }

// ParseLabels parses "k=v,k2=v2".
func ParseLabels(s string) (map[string]string, error) {
	out := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("label %q: want key=value", kv)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("label %q given twice", k)
		}
		out[k] = v
	}
	return out, nil
}

// ParsePorts parses "name=80/TCP,dns=53/UDP" (protocol defaults to TCP).
func ParsePorts(s string) ([]PodPort, error) {
	var out []PodPort
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for _, item := range strings.Split(s, ",") {
		name, rest, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("port %q: want name=PORT[/TCP|UDP]", item)
		}
		num, proto, _ := strings.Cut(rest, "/")
		if proto == "" {
			proto = "TCP"
		}
		n, err := strconv.Atoi(num)
		if err != nil {
			return nil, fmt.Errorf("port %q: %w", item, err)
		}
		out = append(out, PodPort{Name: name, Port: int32(n), Protocol: strings.ToUpper(proto)})
	}
	return out, nil
}

// podObject is the Pod object the agents get for p.
func (p *NamedPod) podObject() k8sobj.Object {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels},
		Spec:       corev1.PodSpec{NodeName: NodeNS(p.Node), Containers: []corev1.Container{{Name: "app", Image: "lab"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, ip := range []string{p.IP, p.IP6} { // an IPv6-only lab's pod has IP6 alone
		if ip != "" {
			if pod.Status.PodIP == "" {
				pod.Status.PodIP = ip
			}
			pod.Status.PodIPs = append(pod.Status.PodIPs, corev1.PodIP{IP: ip})
		}
	}
	for _, pp := range p.Ports {
		pod.Spec.Containers[0].Ports = append(pod.Spec.Containers[0].Ports,
			corev1.ContainerPort{Name: pp.Name, ContainerPort: pp.Port, Protocol: corev1.Protocol(pp.Protocol)})
	}
	return k8sobj.Object{Kind: k8sobj.KindPod, Pod: k8sobj.SlimPod(pod)}
}

// cniArgs are the CNI_ARGS of the pod's ADD: what kubelet passes plus one
// LANEKIT_LABEL_ arg per label (agent.ArgLabelPrefix).
func (p *NamedPod) cniArgs() [][2]string {
	args := [][2]string{{"IgnoreUnknown", "1"}, {agent.ArgPodNamespace, p.Namespace}, {agent.ArgPodName, p.Name},
		{"K8S_POD_INFRA_CONTAINER_ID", p.NS}}
	keys := make([]string, 0, len(p.Labels))
	for k := range p.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, [2]string{agent.ArgLabelPrefix + k, p.Labels[k]})
	}
	return args
}

func (p *NamedPod) runtimeConf() *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: p.NS, NetNS: netnsPath(p.NS), IfName: PodIfName, Args: p.cniArgs()}
}

// AddPod creates a named pod on a node: its netns, the CNI ADD through the
// node's lanekit network (namespace, name and labels in the CNI args), and a
// Pod object applied to every node's agent so that remote nodes know its
// identity. It fails if the name is taken; on failure it undoes what it did.
func AddPod(ctx context.Context, o PodOptions) (_ *NamedPod, err error) {
	st, err := LoadState()
	if err != nil {
		return nil, err
	}
	if o.Namespace == "" {
		o.Namespace = k8sobj.DefaultNamespace
	}
	if o.Node < 1 || o.Node > len(st.Nodes) {
		return nil, fmt.Errorf("pod %s: node %d does not exist (the lab has %d)", o.Name, o.Node, len(st.Nodes))
	}
	if st.BaselineOnly {
		return nil, fmt.Errorf("pod %s: the lab runs without agents (--baseline-only)", o.Name)
	}
	if slices.ContainsFunc(st.NamedPods, func(p NamedPod) bool { return p.Name == o.Name }) {
		return nil, fmt.Errorf("pod %s exists (lanekit lab pod del %s first)", o.Name, o.Name)
	}
	p := &NamedPod{Name: o.Name, Namespace: o.Namespace, Node: o.Node, NS: NamedPodNS(o.Name), Labels: o.Labels, Ports: o.Ports}
	// Validate the Pod object (name, labels, ports) before creating anything;
	// the IP is filled in after the ADD.
	probe := p.podObject()
	probe.Pod.Status = k8sobj.PodStatus{}
	if err := k8sobj.Check(probe); err != nil {
		return nil, fmt.Errorf("pod %s: %w", o.Name, err)
	}
	if len(p.NS) > 64 || !labNetnsRe.MatchString(p.NS) {
		return nil, fmt.Errorf("pod %s: name makes no lab netns name", o.Name)
	}
	if netnsExists(p.NS) {
		return nil, fmt.Errorf("pod %s: netns %s exists (lanekit lab pod del %s)", o.Name, p.NS, o.Name)
	}
	if err := addNetns(ctx, p.NS); err != nil {
		return nil, fmt.Errorf("pod %s: %w", o.Name, err)
	}
	defer func() {
		if err != nil {
			_ = delNamedPod(context.Background(), o.Bins, st, p)
		}
	}()
	cni, list, err := cniFor(o.Bins, o.Node, KindLanekit)
	if err != nil {
		return nil, err
	}
	res, err := cni.AddNetworkList(ctx, list, p.runtimeConf())
	if err != nil {
		return nil, fmt.Errorf("pod %s: cni add: %w", o.Name, err)
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return nil, fmt.Errorf("pod %s: cni result: %w", o.Name, err)
	}
	for _, ipc := range r.IPs {
		if v4 := ipc.Address.IP.To4(); v4 != nil {
			if p.IP == "" {
				p.IP = v4.String()
			}
		} else if p.IP6 == "" {
			p.IP6 = ipc.Address.IP.String()
		}
	}
	if p.IP == "" && p.IP6 == "" { // IPv6 alone: an IPv6-only lab's pod
		return nil, fmt.Errorf("pod %s: cni result has no address", o.Name)
	}
	data, err := k8sobj.Encode([]k8sobj.Object{p.podObject()})
	if err != nil {
		return nil, err
	}
	if err := applyToNodes(ctx, st, data); err != nil {
		return nil, fmt.Errorf("pod %s: push Pod object: %w", o.Name, err)
	}
	st.NamedPods = append(st.NamedPods, *p)
	if err := st.save(); err != nil {
		return nil, err
	}
	return p, nil
}

// DelPod removes a named pod: the Pod object from every agent, CNI DEL and
// its netns. Removing a pod that does not exist is not an error.
func DelPod(ctx context.Context, b Bins, name string) (existed bool, err error) {
	st, err := LoadState()
	if err != nil {
		return false, err
	}
	i := slices.IndexFunc(st.NamedPods, func(p NamedPod) bool { return p.Name == name })
	if i < 0 {
		// Not recorded; a netns left from a crashed add still goes.
		if ns := NamedPodNS(name); labNetnsRe.MatchString(ns) && netnsExists(ns) {
			return true, ip(ctx, "netns", "del", ns)
		}
		return false, nil
	}
	p := st.NamedPods[i]
	if err := delNamedPod(ctx, b, st, &p); err != nil {
		return true, err
	}
	st.NamedPods = slices.Delete(st.NamedPods, i, i+1)
	return true, st.save()
}

func delNamedPod(ctx context.Context, b Bins, st *State, p *NamedPod) error {
	var errs []error
	for _, n := range st.Nodes {
		if !alive(n.AgentPID) {
			continue
		}
		if err := deleteFromAgent(ctx, AgentSocket(n.Index), p.Namespace, p.Name); err != nil {
			errs = append(errs, fmt.Errorf("delete Pod object on %s: %w", n.NS, err))
		}
	}
	if netnsExists(p.NS) {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		cni, list, err := cniFor(b, p.Node, KindLanekit)
		if err == nil {
			err = cni.DelNetworkList(cctx, list, p.runtimeConf())
		}
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("pod %s: cni del: %w", p.Name, err))
		}
		if err := ip(ctx, "netns", "del", p.NS); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func agentClient(sock string) (apiv1.AgentClient, func(), error) {
	if _, err := os.Stat(sock); err != nil {
		return nil, nil, fmt.Errorf("agent not reachable at %s: %w", sock, err)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return apiv1.NewAgentClient(conn), func() { conn.Close() }, nil
}

// ApplyObjects applies YAML/JSON objects to the agent at sock.
func applyToAgent(ctx context.Context, sock string, data []byte) error {
	c, closeFn, err := agentClient(sock)
	if err != nil {
		return err
	}
	defer closeFn()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = c.ApplyObjects(cctx, &apiv1.ApplyObjectsRequest{Data: data})
	return err
}

func deleteFromAgent(ctx context.Context, sock, ns, name string) error {
	c, closeFn, err := agentClient(sock)
	if err != nil {
		return err
	}
	defer closeFn()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = c.DeleteObject(cctx, &apiv1.DeleteObjectRequest{Object: &apiv1.ObjectRef{Kind: string(k8sobj.KindPod), Namespace: ns, Name: name}})
	return err
}

// ApplyEverywhere applies objects (YAML/JSON) to every node's agent: the
// lab's stand-in for an API server that all agents watch.
func ApplyEverywhere(ctx context.Context, data []byte) error {
	st, err := LoadState()
	if err != nil {
		return err
	}
	return applyToNodes(ctx, st, data)
}

// applyToNodes applies objects (YAML/JSON) to the agent of every node of st.
func applyToNodes(ctx context.Context, st *State, data []byte) error {
	for _, n := range st.Nodes {
		if err := applyToAgent(ctx, AgentSocket(n.Index), data); err != nil {
			return fmt.Errorf("%s: %w", n.NS, err)
		}
	}
	return nil
}

// PodAddr returns a named pod's address.
func (p *NamedPod) PodAddr() netip.Addr { a, _ := netip.ParseAddr(p.IP); return a }
