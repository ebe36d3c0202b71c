package agent

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/policy"
	"github.com/lanekit/lanekit/pkg/store"
)

// CNI args (CNI_ARGS, stored as the endpoint's labels) that place a local
// endpoint in the policy world when no Pod object describes it: the pod's
// namespace and name as kubelet passes them, and its labels, one arg per label
// (LANEKIT_LABEL_app=web), as `lanekit lab pod add` passes them.
const (
	ArgPodNamespace = "K8S_POD_NAMESPACE"
	ArgPodName      = "K8S_POD_NAME"
	ArgLabelPrefix  = "LANEKIT_LABEL_"
)

// localEndpoint is how policy sees one of this node's endpoints.
type localEndpoint struct {
	Namespace string
	Name      string
	Labels    map[string]string
	// FromPod: namespace/labels come from a Pod object, not the CNI args.
	FromPod  bool
	Identity policy.Identity
	// EgressBPS is the pod's egress limit (bits/s, 0: none) and
	// BandwidthNote what of its bandwidth annotations is not enforced
	// (bandwidth.go).
	EgressBPS     uint64
	BandwidthNote string
}

// EndpointPolicyInfo is the policy view of a local endpoint for the API.
type EndpointPolicyInfo struct {
	Namespace, Name string
	Labels          map[string]string
	Identity        uint32
	FromPod         bool
	EgressBPS       uint64 // bandwidth.go
	BandwidthNote   string
}

// PolicyInfoOf returns the policy view of local endpoint id as of the last
// compilation.
func (a *Agent) PolicyInfoOf(id uint32) (EndpointPolicyInfo, bool) {
	c := a.ctl
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.locals[id]
	if !ok {
		return EndpointPolicyInfo{}, false
	}
	return EndpointPolicyInfo{Namespace: l.Namespace, Name: l.Name, Labels: maps.Clone(l.Labels), Identity: uint32(l.Identity), FromPod: l.FromPod,
		EgressBPS: l.EgressBPS, BandwidthNote: l.BandwidthNote}, true
}

// argsView returns the namespace, name and labels an endpoint's CNI args give.
func argsView(ep *endpoint.Endpoint) (ns, name string, labels map[string]string) {
	ns, name = ep.Labels[ArgPodNamespace], ep.Labels[ArgPodName]
	if ns == "" {
		ns = k8sobj.DefaultNamespace
	}
	if name == "" {
		name = ep.ContainerID
		if ep.VM != nil {
			name = ep.VM.Name
		}
	}
	labels = map[string]string{}
	for k, v := range ep.Labels {
		if l, ok := strings.CutPrefix(k, ArgLabelPrefix); ok && l != "" {
			labels[l] = v
		}
	}
	return ns, name, labels
}

func namedPorts(pod *k8sobj.Pod) []policy.NamedPort {
	var out []policy.NamedPort
	for _, cs := range [][]k8sobj.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, ctr := range cs {
			for _, p := range ctr.Ports {
				if p.Name == "" {
					continue
				}
				proto, ok := policy.ProtoNum(p.Protocol)
				if !ok {
					continue // resolves for no rule
				}
				out = append(out, policy.NamedPort{Name: p.Name, Proto: proto, Port: uint16(p.ContainerPort)})
			}
		}
	}
	return out
}

// podLive: a pod whose IP may be in use (not finished, not host network).
func podLive(p *k8sobj.Pod) bool {
	return !p.Spec.HostNetwork && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// policyInput assembles the compilation input: this node's endpoints (from
// the store; a Pod object with the same namespace/name overrides the CNI
// args' labels and adds named ports), remote pods (Pod objects whose IP is
// not in this node's pod CIDR), namespaces and policies.
func (a *Agent) policyInput(objs map[string]k8sobj.Object) (policy.Input, map[uint32]localEndpoint, error) {
	// Every policy was validated when the agent took it (checkObjects, or
	// restoreLocked's DecodeJSON for the stored ones).
	in := policy.Input{NamespaceLabels: map[string]map[string]string{}, Validated: true}
	pods := map[string]*k8sobj.Pod{}
	// Only namespaces, policies and pods are policy input, in key order (the
	// policies' order is the compile's): sorting every object's key took
	// most of the agent's CPU at 100,000 Services, under its lock, on each
	// pod relabel (seconds of delay for the service changes queued behind).
	var keys []string
	for key, o := range objs {
		if o.NamespaceObj != nil || o.NetworkPolicy != nil || o.Pod != nil {
			keys = append(keys, key)
		}
	}
	slices.Sort(keys)
	for _, key := range keys {
		o := objs[key]
		switch {
		case o.NamespaceObj != nil:
			in.NamespaceLabels[o.NamespaceObj.Name] = o.NamespaceObj.Labels
		case o.NetworkPolicy != nil:
			in.Policies = append(in.Policies, o.NetworkPolicy)
		case o.Pod != nil:
			pods[o.Pod.Namespace+"/"+o.Pod.Name] = o.Pod
		}
	}
	eps, err := a.endpoints()
	if err != nil {
		return in, nil, err
	}
	// Oldest first: when the ipcache is full, a new endpoint finds no room
	// (its ADD is refused: capacity.go) rather than take an older one's.
	slices.SortStableFunc(eps, func(x, y endpoint.Endpoint) int {
		return cmp.Or(x.Created.Compare(y.Created), cmp.Compare(x.ID, y.ID))
	})
	locals := map[uint32]localEndpoint{}
	used := map[netip.Addr]bool{}
	for i := range eps {
		ep := &eps[i]
		if ep.Pending || !ep.IP.IsValid() && !ep.IP6.IsValid() { // IP alone invalid: an IPv6-only node
			continue
		}
		ns, name, labels := argsView(ep)
		pe := policy.Endpoint{Namespace: ns, Name: name, Labels: labels, IP: ep.IP, IP6: ep.IP6, Local: true}
		fromPod := false
		var egress uint64
		var bwNote string
		if pod := pods[ns+"/"+name]; pod != nil && podLive(pod) {
			pe.Labels, pe.NamedPorts, fromPod = maps.Clone(pod.Labels), namedPorts(pod), true
			if pe.Labels == nil {
				pe.Labels = map[string]string{}
			}
			if ep.VM == nil { // a VM's frames leave through its backend, not a paced path
				egress, bwNote = bandwidthOf(pod, a.cfg.BandwidthManager)
			}
		}
		if used[ep.IP] && ep.IP.IsValid() {
			continue // cannot happen: IPAM hands out each address once
		}
		used[ep.IP], used[ep.IP6] = true, true
		in.Endpoints = append(in.Endpoints, pe)
		locals[ep.ID] = localEndpoint{Namespace: ns, Name: name, Labels: pe.Labels, FromPod: fromPod, EgressBPS: egress, BandwidthNote: bwNote}
	}
	podCIDR := a.cfg.PodCIDR
	for _, key := range slices.Sorted(maps.Keys(pods)) {
		pod := pods[key]
		ip, ok4 := k8sobj.PodIPv4(pod)
		ip6, ok6 := k8sobj.PodIPv6(pod)
		// Local pods are the endpoints above; a pod object with a local
		// address but no endpoint is stale or not added yet. A pod of an
		// IPv6-only node is known by its IPv6 address alone.
		switch {
		case !podLive(pod), ok4 && (used[ip] || podCIDR.Contains(ip)):
			continue
		case !ok4 && (!ok6 || used[ip6] || a.cfg.PodCIDR6.Contains(ip6)):
			continue
		}
		pe := policy.Endpoint{Namespace: pod.Namespace, Name: pod.Name, Labels: pod.Labels, NamedPorts: namedPorts(pod)}
		if ok4 {
			used[ip], pe.IP = true, ip
		}
		if ok6 && !used[ip6] {
			used[ip6], pe.IP6 = true, ip6
		}
		in.Endpoints = append(in.Endpoints, pe)
	}
	return in, locals, nil
}

// compilePolicy compiles next with the agent's identities. Identities it
// allocates are queued for the store (commit writes them before anything
// uses them in the datapath). Called with ctl.mu.
func (a *Agent) compilePolicy(next map[string]k8sobj.Object) (*policy.Compiled, map[uint32]localEndpoint, error) {
	c := a.ctl
	in, locals, err := a.policyInput(next)
	if err != nil {
		return nil, nil, fmt.Errorf("policy input: %w", err)
	}
	// Allocate up front what Compile would, so every identity is recorded.
	for _, ep := range in.Endpoints {
		c.noteIdentity(c.ids.ForLabels(ep.Namespace, ep.Labels))
	}
	for _, p := range in.Policies {
		for _, r := range p.Spec.Ingress {
			c.notePeers(r.From)
		}
		for _, r := range p.Spec.Egress {
			c.notePeers(r.To)
		}
	}
	in.Limits = c.policyLimits()
	compiled, err := policy.Compile(in, c.ids)
	if err != nil {
		return nil, nil, fmt.Errorf("compile policy: %w: %w", err, ErrInvalid)
	}
	for id, l := range locals {
		l.Identity = c.ids.ForLabels(l.Namespace, l.Labels)
		locals[id] = l
	}
	for _, w := range compiled.Warnings {
		a.log.Warn("policy", "warning", w)
	}
	c.logFit(compiled)
	return compiled, locals, nil
}

func (c *ctlPlane) notePeers(peers []networkingv1.NetworkPolicyPeer) {
	for _, p := range peers {
		if p.IPBlock == nil {
			continue
		}
		for _, s := range append([]string{p.IPBlock.CIDR}, p.IPBlock.Except...) {
			if pfx, err := netip.ParsePrefix(s); err == nil && pfx.Addr().Is4() {
				c.noteIdentity(c.ids.ForCIDR(pfx))
			}
		}
	}
}

func (c *ctlPlane) noteIdentity(id policy.Identity) {
	if c.idsStored[id] || id == policy.IdentityWorld {
		return
	}
	if _, queued := c.idsToSave[id]; queued {
		return
	}
	info, _ := c.ids.Info(id)
	si := storedIdentity{Namespace: info.Namespace, Labels: info.Labels}
	if info.Prefix.IsValid() && id.IsCIDR() {
		si = storedIdentity{Prefix: info.Prefix.String()}
	}
	c.idsToSave[id] = si
}

func identityKey(id policy.Identity) []byte { return binary.BigEndian.AppendUint32(nil, uint32(id)) }

func (c *ctlPlane) saveIdentitiesTx(tx *store.Tx) error {
	for id, si := range c.idsToSave {
		if err := tx.Put(store.Identities, identityKey(id), si); err != nil {
			return err
		}
	}
	return nil
}

func (c *ctlPlane) markIdentitiesSaved() {
	for id := range c.idsToSave {
		c.idsStored[id] = true
	}
	clear(c.idsToSave)
}

// restoreIdentities replays the stored identity allocations in ID order, so
// the allocator hands out the same identities as before the restart (the
// pinned policy maps are keyed by them).
func (a *Agent) restoreIdentities() error {
	c := a.ctl
	type rec struct {
		id policy.Identity
		si storedIdentity
	}
	var recs []rec
	err := a.st.View(func(tx *store.Tx) error {
		return tx.ForEach(store.Identities, func(k []byte, raw json.RawMessage) error {
			if len(k) != 4 {
				return nil
			}
			var si storedIdentity
			if err := json.Unmarshal(raw, &si); err != nil {
				return fmt.Errorf("decode identity %x: %w", k, err)
			}
			recs = append(recs, rec{policy.Identity(binary.BigEndian.Uint32(k)), si})
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("restore identities: %w", err)
	}
	mismatch := 0
	for _, r := range recs { // byte order of big-endian keys = ID order
		var got policy.Identity
		if r.si.Prefix != "" {
			pfx, err := netip.ParsePrefix(r.si.Prefix)
			if err != nil {
				return fmt.Errorf("restore identity %d: %w", r.id, err)
			}
			got = c.ids.ForCIDR(pfx)
		} else {
			got = c.ids.ForLabels(r.si.Namespace, r.si.Labels)
		}
		c.idsStored[r.id] = true
		if got != r.id {
			mismatch++
			c.noteIdentity(got)
		}
	}
	if mismatch > 0 {
		a.log.Error("restored identities differ from the stored ones; policy maps are rewritten", "mismatched", mismatch)
	}
	return nil
}
