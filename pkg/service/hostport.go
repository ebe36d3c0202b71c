package service

import (
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// HostPortPrefix starts the ServiceID name of a pod's hostPorts: "hostport/"
// and the pod's name ("/" is in no Service name, so the two never meet).
const HostPortPrefix = "hostport/"

// HostPortID names the pseudo-service that holds a pod's hostPorts.
func HostPortID(pod *k8sobj.Pod) ServiceID {
	return ServiceID{Namespace: pod.Namespace, Name: HostPortPrefix + pod.Name}
}

// IsHostPort says whether id holds a pod's hostPorts.
func (id ServiceID) IsHostPort() bool { return strings.HasPrefix(id.Name, HostPortPrefix) }

// HasHostPorts says whether any container of the pod asks for a hostPort.
func HasHostPorts(pod *k8sobj.Pod) bool {
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.HostPort > 0 {
				return true
			}
		}
	}
	return false
}

// HostPortFrontends translates a pod's hostPorts into frontends, as the CNI
// portmap plugin would DNAT them (and Cilium's BPF hostPort does): each
// containers[].ports[] entry with a hostPort becomes a NodePort-scope frontend
// on its hostIP (unset or unspecified: every node address; 127.0.0.1 answers
// the node's own processes on loopback) whose one backend is the pod's address
// of that family and containerPort, until the pod has stopped (a terminating
// pod keeps them, as portmap's rules stay until the sandbox's CNI DEL). A
// dual-stack pod gets them for both families. Only a pod on this node (its
// address in opts.LocalPrefixes) gets any; hostNetwork pods need none (they
// bind the port themselves).
//
// A hostIP that is not this node's own (Options.IsNodeAddr) gets no frontend:
// a frontend is matched before routing for every packet the node's pods and
// processes send, so a pod naming another pod's address, 169.254.169.254 or
// the API server's as hostIP would capture their connections to it. Such
// ports are what HostPortsIgnored returns; the pod's other hostPorts stay.
func HostPortFrontends(pod *k8sobj.Pod, opts Options) []*Frontend {
	out, _ := hostPorts(pod, opts)
	return out
}

// HostPortsIgnored returns the hostPorts of a pod on this node that get no
// frontend because their hostIP is not an address of this node or their
// protocol is not load-balanced (SCTP).
func HostPortsIgnored(pod *k8sobj.Pod, opts Options) []Ignored {
	_, ignored := hostPorts(pod, opts)
	return ignored
}

// hostPorts is HostPortFrontends and HostPortsIgnored in one pass.
func hostPorts(pod *k8sobj.Pod, opts Options) ([]*Frontend, []Ignored) {
	if pod.Spec.HostNetwork || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil, nil
	}
	var podIPs []netip.Addr
	for _, s := range append([]string{pod.Status.PodIP}, podIPStrings(pod)...) {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Is4In6() || slices.ContainsFunc(podIPs, func(b netip.Addr) bool { return b.Is4() == a.Is4() }) ||
			!slices.ContainsFunc(opts.LocalPrefixes, func(p netip.Prefix) bool { return p.Contains(a) }) {
			continue
		}
		podIPs = append(podIPs, a)
	}
	id := HostPortID(pod)
	var out []*Frontend
	var ignored []Ignored
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.HostPort <= 0 || p.HostPort > 65535 {
				continue
			}
			proto := protoOf(&p.Protocol)
			hostIP, err := netip.ParseAddr(p.HostIP)
			if !proto.served() {
				ignored = append(ignored, Ignored{Addr: hostIP, Port: uint16(p.HostPort), Proto: proto, Reason: ReasonProtocolUnsupported})
				continue
			}
			if err == nil && !hostIP.IsUnspecified() && len(podIPs) > 0 && !opts.IsNodeAddr(hostIP) {
				ignored = append(ignored, Ignored{Addr: hostIP, Port: uint16(p.HostPort), Proto: proto, Reason: ReasonHostIPNotNode})
				continue
			}
			for _, podIP := range podIPs {
				var addrs []netip.Addr
				switch {
				case err == nil && !hostIP.IsUnspecified() && hostIP.Is4() != podIP.Is4():
					continue // a hostIP of the other family
				case err == nil && !hostIP.IsUnspecified():
					addrs = []netip.Addr{hostIP}
				default:
					addrs = slices.DeleteFunc(slices.Clone(opts.NodeAddrs), func(a netip.Addr) bool { return a.Is4() != podIP.Is4() })
				}
				backends := []Backend{{Addr: podIP, Port: uint16(p.ContainerPort), State: BackendActive}}
				table := maglevFor(backends, proto)
				for _, a := range addrs {
					key := FrontendKey{Addr: a, Port: uint16(p.HostPort), Proto: proto, Scope: ScopeNodePort}
					if slices.ContainsFunc(out, func(f *Frontend) bool { return f.Key == key }) {
						continue // the API server refuses duplicates; keep the first
					}
					out = append(out, &Frontend{Key: key, Service: id, PortName: p.Name, Backends: backends, Maglev: table})
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b *Frontend) int { return compareKeys(a.Key, b.Key) })
	return out, ignored
}

func podIPStrings(pod *k8sobj.Pod) []string {
	out := make([]string, 0, len(pod.Status.PodIPs))
	for _, p := range pod.Status.PodIPs {
		out = append(out, p.IP)
	}
	return out
}
