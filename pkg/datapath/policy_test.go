package datapath

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/policy"
)

// truthWorld is pkg/policy's truth-table cluster (testdata/truth.yaml): three
// namespaces of web, db and client pods; the policies cover every peer
// and port form.
func truthWorld(t *testing.T) policy.Input {
	t.Helper()
	b, err := os.ReadFile("../policy/testdata/truth.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := k8sobj.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	_, _, pols := k8sobj.Split(objs)
	in := policy.Input{Policies: pols, NamespaceLabels: map[string]map[string]string{
		"alpha": {"team": "blue"},
		"beta":  {"team": "blue", "env": "prod"},
		"gamma": {"team": "red"},
	}}
	for ni, ns := range []string{"alpha", "beta", "gamma"} {
		for pi, role := range []string{"web", "db", "client"} {
			ep := policy.Endpoint{Namespace: ns, Name: role, IP: netip.AddrFrom4([4]byte{10, 244, byte(ni), byte(pi + 1)}),
				Labels: map[string]string{"app": role, "tier": []string{"front", "back", "front"}[pi]}}
			if role == "web" {
				http := uint16(80)
				if ns == "beta" {
					http = 81
				}
				ep.NamedPorts = []policy.NamedPort{{Name: "http", Proto: policy.ProtoTCP, Port: http}, {Name: "dns", Proto: policy.ProtoUDP, Port: 81}}
			}
			in.Endpoints = append(in.Endpoints, ep)
		}
	}
	return in
}

// TestPolicyMatchesCompiled judges a random sample of new connections
// through the BPF programs and compares each verdict with
// policy.Compiled.Allowed (which pkg/policy checks against its independent
// model of the Kubernetes semantics): pod to pod and pod to external through
// from_pod, external to pod through from_uplink. All nine pods of the truth
// cluster are local here; the sender is whichever pod the fixture device
// claims to be for that packet.
func TestPolicyMatchesCompiled(t *testing.T) {
	e := newFixtureEnv(t)
	in := truthWorld(t)
	c, err := policy.Compile(in, policy.NewIdentities())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.dp.ApplyPolicy(policy.Diff(nil, c)); err != nil {
		t.Fatal(err)
	}
	pods := in.Endpoints
	for i, p := range pods {
		ep := Endpoint{ID: uint32(100 + i), IfIndex: e.h2.Attrs().Index, IP: p.IP, MAC: pod2MAC, HostMAC: e.ep2.HostMAC}
		if err := e.dp.pod.LkEndpoints.Put(ipKey(p.IP.As4()), ep.info()); err != nil {
			t.Fatal(err)
		}
	}
	externals := []string{"192.168.2.5", "192.168.1.5", "172.16.0.1", "10.1.2.3", "10.2.0.1", "8.8.8.8", "8.8.4.4"}
	ports := []uint16{53, 79, 80, 81, 82, 443, 8080}
	rng := rand.New(rand.NewPCG(12, 1))
	counts := map[string]int{}
	const samples = 600
	for i := range samples {
		proto := []uint8{ipProtoTCP, ipProtoUDP, ipProtoICMP}[rng.IntN(3)]
		port := ports[rng.IntN(len(ports))]
		if rng.IntN(4) == 0 {
			port = uint16(1 + rng.IntN(65535))
		}
		if proto == ipProtoICMP {
			port = 0
		}
		var src, dst string
		var prog *ebpf.Program
		var ifindex int
		var frame []byte
		switch kind := rng.IntN(3); kind {
		case 0, 1: // from a local pod: to a pod, or out
			sp := pods[rng.IntN(len(pods))]
			src = sp.IP.String()
			if kind == 0 {
				dst = pods[rng.IntN(len(pods))].IP.String()
			} else {
				dst = externals[rng.IntN(len(externals))]
			}
			ep := Endpoint{ID: 1, IfIndex: e.h1.Attrs().Index, IP: sp.IP, MAC: pod1MAC, HostMAC: e.ep1.HostMAC}
			if err := e.dp.pod.LkEpByIfindex.Put(uint32(ep.IfIndex), ep.info()); err != nil {
				t.Fatal(err)
			}
			prog, ifindex = e.dp.pod.FromPod, e.h1.Attrs().Index
			frame = polFrame(e.ep1.HostMAC, pod1MAC, src, dst, proto, nextSport(), port)
		default: // from outside the cluster into a pod
			src = externals[rng.IntN(len(externals))]
			dst = pods[rng.IntN(len(pods))].IP.String()
			prog, ifindex = e.dp.uplink.FromUplink, e.up.Attrs().Index
			frame = polFrame(e.up.Attrs().HardwareAddr, neighMAC, src, dst, proto, nextSport(), port)
		}
		if src == dst {
			continue // a pod talking to itself does not leave it
		}
		want := c.Allowed(netip.MustParseAddr(src), netip.MustParseAddr(dst), proto, port)
		opts := &ebpf.RunOptions{Data: bytes.Clone(frame), DataOut: make([]byte, len(frame)+256), Context: skbCtx{Ifindex: uint32(ifindex)}}
		ret, err := prog.Run(opts)
		if err != nil {
			t.Fatalf("sample %d: run: %v", i, err)
		}
		wantRet := uint32(tcActShot)
		if want.Allowed {
			wantRet = tcActRedirect
		}
		if ret != wantRet {
			t.Errorf("sample %d: %s -> %s proto %d port %d: verdict %d, want %d (%s)", i, src, dst, proto, port, ret, wantRet, want.Reason)
		}
		counts[fmt.Sprint(want.Allowed)]++
	}
	t.Logf("%d samples: %d allowed, %d denied", samples, counts["true"], counts["false"])
	if counts["true"] < samples/10 || counts["false"] < samples/10 {
		t.Fatalf("sample too one-sided to judge: %v", counts)
	}
}

// TestPolicySizeIndependentOfPods: 10 and 1,000 pods of the same label sets
// load the same number of rule, isolation and CIDR entries; only the
// ipcache (one entry per pod IP) grows. Also times ApplyPolicy.
func TestPolicySizeIndependentOfPods(t *testing.T) {
	e := newFixtureEnv(t)
	e.enter(t)
	pols := []*networkingv1.NetworkPolicy{}
	for i := range 20 {
		pols = append(pols, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", i%2), Name: fmt.Sprintf("p%d", i)},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("a%d", i%5)}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("a%d", (i+1)%5)}}},
						{IPBlock: &networkingv1.IPBlock{CIDR: "192.168.0.0/16", Except: []string{fmt.Sprintf("192.168.%d.0/24", i)}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Port: ptr(intstr.FromString("http"))}, {Port: ptr(intstr.FromInt32(int32(1000 + i))), EndPort: ptr(int32(1100 + i))}},
				}}}})
	}
	pods := func(n int) []policy.Endpoint {
		var eps []policy.Endpoint
		for i := range n {
			eps = append(eps, policy.Endpoint{Namespace: fmt.Sprintf("ns%d", i%2), Name: fmt.Sprint(i), IP: netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}),
				Labels: map[string]string{"app": fmt.Sprintf("a%d", i%5)}, NamedPorts: []policy.NamedPort{{Name: "http", Proto: policy.ProtoTCP, Port: 8080}}})
		}
		return eps
	}
	ids := policy.NewIdentities()
	var prev *policy.Compiled
	var got []PolicyMapCounts
	for _, n := range []int{10, 1000} {
		c, err := policy.Compile(policy.Input{Endpoints: pods(n), Policies: pols}, ids)
		if err != nil {
			t.Fatal(err)
		}
		u := policy.Diff(prev, c)
		start := time.Now()
		if err := e.dp.ApplyPolicy(u); err != nil {
			t.Fatal(err)
		}
		t.Logf("%d pods: applied %s in %v", n, u, time.Since(start))
		prev = c
		counts, err := e.dp.PolicyMapCounts()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d pods: map entries %+v", n, counts)
		if counts.IPCache != n {
			t.Fatalf("%d pods: ipcache holds %d entries", n, counts.IPCache)
		}
		got = append(got, counts)
	}
	small, big := got[0], got[1]
	if small.Rules != big.Rules || small.Isolated != big.Isolated || small.CIDRs != big.CIDRs || small.Rules == 0 {
		t.Fatalf("policy maps grew with pods: 10 pods %+v, 1000 pods %+v", small, big)
	}
}

// TestApplyPolicyRefusesBadInput: an update with one bad entry is refused
// whole, naming the entry, and writes nothing.
func TestApplyPolicyRefusesBadInput(t *testing.T) {
	e := newFixtureEnv(t)
	good := policy.RuleKey{Subject: 70000, Peer: 70001, Direction: policy.Ingress, Proto: policy.ProtoTCP, Port: 80, PortPrefix: 16}
	tests := []struct {
		name string
		u    *policy.Update
		want string
	}{
		{"IPv4-mapped ipcache entry", &policy.Update{IPCache: map[netip.Addr]policy.Identity{netip.MustParseAddr("::ffff:10.0.0.1"): 70000}}, "not an IPv4 or IPv6 address"},
		{"CIDR identity on an endpoint IPv6", &policy.Update{IPCache: map[netip.Addr]policy.Identity{netip.MustParseAddr("fd00::1"): 20}}, "not an endpoint identity"},
		{"unmasked IPv6 prefix", &policy.Update{CIDRs: map[netip.Prefix]policy.Identity{netip.MustParsePrefix("fd00::1/64"): 20}}, "not a masked IPv4 or IPv6 prefix"},
		{"CIDR identity on an endpoint IP", &policy.Update{IPCache: map[netip.Addr]policy.Identity{netip.MustParseAddr("10.0.0.1"): 20}}, "not an endpoint identity"},
		{"unmasked prefix", &policy.Update{CIDRs: map[netip.Prefix]policy.Identity{netip.MustParsePrefix("10.0.0.1/8"): 20}}, "not a masked IPv4 or IPv6 prefix"},
		{"port bits beyond the prefix", &policy.Update{Rules: map[policy.RuleKey]policy.RuleValue{
			{Subject: 70000, Peer: 70001, Proto: policy.ProtoTCP, Port: 81, PortPrefix: 15}: {}}}, "bits beyond its prefix"},
		{"policy index beyond the counters", &policy.Update{Rules: map[policy.RuleKey]policy.RuleValue{good: {Policy: MaxPolicies}}}, "exceeds"},
	}
	for _, tt := range tests {
		tt.u.Rules = mapWith(tt.u.Rules, good)
		err := e.dp.ApplyPolicy(tt.u)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err %v, want %q", tt.name, err, tt.want)
		}
		counts, err := e.dp.PolicyMapCounts()
		if err != nil {
			t.Fatal(err)
		}
		if counts != (PolicyMapCounts{}) {
			t.Fatalf("%s: refused update left entries %+v", tt.name, counts)
		}
	}
}

// mapWith adds a valid rule to m (unless m already has k) so that a refused
// update also carries entries that would have been written.
func mapWith(m map[policy.RuleKey]policy.RuleValue, k policy.RuleKey) map[policy.RuleKey]policy.RuleValue {
	if m == nil {
		m = map[policy.RuleKey]policy.RuleValue{}
	}
	if _, ok := m[k]; !ok {
		m[k] = policy.RuleValue{}
	}
	return m
}

// TestApplyPolicyFailsClosed: an update that cannot be written whole (the
// rules map is full) leaves the pods it newly selects isolated and the pods
// it would open still isolated, and reports the error; applied again once
// there is room, it completes. The rules map the loader writes is swapped for
// a one-entry map to make it full.
func TestApplyPolicyFailsClosed(t *testing.T) {
	e := newFixtureEnv(t)
	const newlySelected, wasSelected = policy.Identity(70010), policy.Identity(70011)
	rule := func(subject policy.Identity, port uint16) policy.RuleKey {
		return policy.RuleKey{Subject: subject, Peer: 70020, Direction: policy.Ingress, Proto: policy.ProtoTCP, Port: port, PortPrefix: 16}
	}
	// Before: wasSelected is isolated with one allow.
	before := &policy.Update{
		Isolated: map[policy.Identity]policy.Isolation{wasSelected: {PolicyIngress: 1}},
		Rules:    map[policy.RuleKey]policy.RuleValue{rule(wasSelected, 80): {}},
	}
	if err := e.dp.ApplyPolicy(before); err != nil {
		t.Fatal(err)
	}
	info, err := e.dp.pod.LkPolicyRules.Info()
	if err != nil {
		t.Fatal(err)
	}
	tiny, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.LPMTrie, KeySize: info.KeySize, ValueSize: info.ValueSize, MaxEntries: 1, Flags: info.Flags})
	if err != nil {
		t.Fatal(err)
	}
	defer tiny.Close()
	if err := tiny.Put(policyKey(rule(70099, 1)), podPolicyValue{}); err != nil { // now full
		t.Fatal(err)
	}
	orig := e.dp.pod.LkPolicyRules
	e.dp.pod.LkPolicyRules = tiny
	// The update: newlySelected becomes isolated with two allows; wasSelected
	// is no longer selected (its rule goes, its isolation goes).
	u := &policy.Update{
		Isolated:       map[policy.Identity]policy.Isolation{newlySelected: {PolicyIngress: 1}},
		Rules:          map[policy.RuleKey]policy.RuleValue{rule(newlySelected, 80): {}, rule(newlySelected, 443): {}},
		IsolatedDelete: []policy.Identity{wasSelected},
	}
	err = e.dp.ApplyPolicy(u)
	e.dp.pod.LkPolicyRules = orig
	if err == nil {
		t.Fatal("an update that does not fit was applied without error")
	}
	isolated := func(id policy.Identity) bool {
		var v podPolicyIsolation
		return e.dp.pod.LkPolicyIsolation.Lookup(uint32(id), &v) == nil && v.PolicyIngress != 0
	}
	if !isolated(newlySelected) {
		t.Errorf("the failed update left the pod it selects open: no isolation for %d (%v)", newlySelected, err)
	}
	if !isolated(wasSelected) {
		t.Errorf("the failed update opened %d before its allows were written (%v)", wasSelected, err)
	}
	// Applied again with room (the agent keeps a failed update queued).
	if err := e.dp.ApplyPolicy(u); err != nil {
		t.Fatalf("re-apply: %v", err)
	}
	if !isolated(newlySelected) || isolated(wasSelected) {
		t.Errorf("after re-apply: isolated %d %v, %d %v", newlySelected, isolated(newlySelected), wasSelected, isolated(wasSelected))
	}
}
