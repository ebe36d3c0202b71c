package lbipam

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

func lease(node string, renew time.Time) *coordinationv1.Lease {
	t := metav1.NewMicroTime(renew)
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "lanekit-l2-" + node},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To(int32(3)), RenewTime: &t}}
}

func assigned(name, ip string, local bool) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "d", Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: ip}}},
			Conditions: []metav1.Condition{{Type: ConditionType, Status: metav1.ConditionTrue}}}}
	if local {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	return s
}

// testL2 is node's announcer, its own Lease renewed at now, with one pool
// of 192.0.2.0/24 and 2001:db8::/64 read.
func testL2(t *testing.T, node string, now time.Time) *L2 {
	t.Helper()
	l, err := NewL2(L2Config{Client: fake.NewClientset(), Node: node, Namespace: "x", Announce: &fakeAnnounce{}})
	if err != nil {
		t.Fatal(err)
	}
	l.ownOK = now
	if err := l.pools.update(poolsCM("1", "pools: [{name: p, addresses: ['192.0.2.0/24', '2001:db8::/64']}]"), slog.Default()); err != nil {
		t.Fatal(err)
	}
	return l
}

func poolsCM(version, doc string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: DefaultPoolsConfigMap, Namespace: "x", ResourceVersion: version},
		Data: map[string]string{PoolsKey: doc}}
}

// From the side of whoever can write a Service's status (another
// controller, a tenant granted services/status): addresses lanekit's pools
// do not hold — the underlay's gateway, another host — are never answered
// for, whatever the status and its condition say; the pool's own are. A
// malformed pools ConfigMap keeps the pools last read; a deleted one
// answers for nothing.
func TestL2AnswersOnlyForPoolAddresses(t *testing.T) {
	now := time.Unix(5000, 0)
	l := testL2(t, "a", now)
	leases := []*coordinationv1.Lease{lease("a", now)}
	hijack := assigned("hijack", "10.77.0.1", false) // the underlay's gateway
	hijack.Status.LoadBalancer.Ingress = append(hijack.Status.LoadBalancer.Ingress,
		corev1.LoadBalancerIngress{IP: "192.0.2.5"}, corev1.LoadBalancerIngress{IP: "2001:db8:1::1"})
	svcs := []*corev1.Service{hijack, assigned("ok", "2001:db8::7", false)}
	if got := l.announce(now, leases, svcs, nil); !slices.Equal(got, addrs("192.0.2.5", "2001:db8::7")) {
		t.Fatalf("announces %v, want only the pool's 192.0.2.5 and 2001:db8::7", got)
	}
	if err := l.pools.update(poolsCM("2", "pools: [{name: p, addresses: ['192.0.2.0/24'"), slog.Default()); err == nil {
		t.Fatal("malformed pools accepted")
	}
	if got := l.announce(now, leases, svcs, nil); !slices.Equal(got, addrs("192.0.2.5", "2001:db8::7")) {
		t.Errorf("after a malformed edit: %v, want the last pools' addresses", got)
	}
	if err := l.pools.update(poolsCM("3", "pools: [{name: p, addresses: ['2001:db8::/64']}]"), slog.Default()); err != nil {
		t.Fatal(err)
	}
	if got := l.announce(now, leases, svcs, nil); !slices.Equal(got, addrs("2001:db8::7")) {
		t.Errorf("after the IPv4 range left the pool: %v, want 2001:db8::7", got)
	}
	if err := l.pools.update(nil, slog.Default()); err != nil {
		t.Fatal(err)
	}
	if got := l.announce(now, leases, svcs, nil); len(got) != 0 {
		t.Errorf("with no pools ConfigMap: %v, want nothing", got)
	}
}

// The announcer set of each node: eTP Local only on a node with a ready
// endpoint, nothing lanekit did not assign, nothing from a node whose own
// Lease renewals fail, and a node whose Lease stops being renewed drops out
// after the Lease duration (by the observer's clock).
func TestL2Announce(t *testing.T) {
	now := time.Unix(5000, 0)
	mk := func(node string) *L2 { return testL2(t, node, now) }
	leases := []*coordinationv1.Lease{lease("a", now), lease("b", now)}
	// A Service the hash alone would give to a, whose only ready endpoint
	// is on b.
	loc := ""
	for i := 0; loc == ""; i++ {
		if n := fmt.Sprintf("loc%d", i); Elect("d/"+n, []string{"a", "b"}) == "a" {
			loc = n
		}
	}
	foreign := assigned("foreign", "192.0.2.9", false)
	foreign.Status.Conditions = nil // another controller's address
	svcs := []*corev1.Service{assigned(loc, "192.0.2.1", true), foreign}
	eps := []*discoveryv1.EndpointSlice{{ObjectMeta: metav1.ObjectMeta{Namespace: "d", Labels: map[string]string{discoveryv1.LabelServiceName: loc}},
		Endpoints: []discoveryv1.Endpoint{{NodeName: ptr.To("b"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
			{NodeName: ptr.To("a"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}}}}}
	a, b := mk("a"), mk("b")
	if got := a.announce(now, leases, svcs, eps); len(got) != 0 {
		t.Errorf("a (no ready endpoint of loc, eTP Local) announces %v", got)
	}
	if got := b.announce(now, leases, svcs, eps); !slices.Equal(got, addrs("192.0.2.1")) {
		t.Errorf("b (loc's only ready endpoint) announces %v, want 192.0.2.1", got)
	}
	b.ownOK = now.Add(-4 * time.Second) // b's own renewals failing
	if got := b.announce(now, leases, svcs, eps); len(got) != 0 {
		t.Errorf("b announces %v while its own Lease is not renewed", got)
	}

	// eTP Cluster: one of the two; when it stops renewing, the other after
	// the duration, not before.
	svcs = []*corev1.Service{assigned("c", "192.0.2.2", false)}
	win := Elect("d/c", []string{"a", "b"})
	other := map[string]*L2{"a": b, "b": a}[win]
	if got := other.announce(now, leases, svcs, nil); len(got) != 0 {
		t.Fatalf("the loser announces %v", got)
	}
	frozen := []*coordinationv1.Lease{lease("a", now), lease("b", now)} // nobody renews
	other.ownOK = now.Add(2900 * time.Millisecond)
	if got := other.announce(now.Add(2900*time.Millisecond), frozen, svcs, nil); len(got) != 0 {
		t.Errorf("took over before the winner's Lease expired: %v", got)
	}
	other.ownOK = now.Add(3100 * time.Millisecond)
	if got := other.announce(now.Add(3100*time.Millisecond), frozen, svcs, nil); !slices.Equal(got, addrs("192.0.2.2")) {
		t.Errorf("no takeover after the winner's Lease expired: %v", got)
	}
}

// Rendezvous hashing: a node leaving moves only its own Services.
func TestElectMovesOnlyTheLeaversServices(t *testing.T) {
	nodes := []string{"n1", "n2", "n3", "n4"}
	moved, owned := 0, map[string]int{}
	for i := range 200 {
		key := fmt.Sprintf("ns/s%d", i)
		before := Elect(key, nodes)
		owned[before]++
		after := Elect(key, []string{"n1", "n2", "n4"})
		if before != "n3" && after != before {
			t.Fatalf("%s moved %s -> %s though n3 left", key, before, after)
		}
		if before == "n3" {
			moved++
		}
	}
	for _, n := range nodes {
		if owned[n] < 20 {
			t.Errorf("node %s announces %d of 200 Services: unbalanced %v", n, owned[n], owned)
		}
	}
	if Elect("x", nil) != "" {
		t.Error("a Service with no candidate has an announcer")
	}
}

// eTP Local: the announcer is the node with the most ready local endpoints
// (all the Service's traffic lands on it), whatever the hash prefers; with
// equal counts the hash decides, as without endpoints to weigh.
func TestL2LocalPrefersMostEndpoints(t *testing.T) {
	now := time.Unix(5000, 0)
	leases := []*coordinationv1.Lease{lease("a", now), lease("b", now)}
	// A Service the hash alone gives to a.
	name := ""
	for i := 0; name == ""; i++ {
		if n := fmt.Sprintf("aff%d", i); Elect("d/"+n, []string{"a", "b"}) == "a" {
			name = n
		}
	}
	svcs := []*corev1.Service{assigned(name, "192.0.2.7", true)}
	ep := func(node string, ready bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{NodeName: ptr.To(node), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)}}
	}
	slice := func(eps ...discoveryv1.Endpoint) []*discoveryv1.EndpointSlice {
		return []*discoveryv1.EndpointSlice{{ObjectMeta: metav1.ObjectMeta{Namespace: "d", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			Endpoints: eps}}
	}
	announcer := func(eps []*discoveryv1.EndpointSlice) string {
		var who []string
		for _, n := range []string{"a", "b"} {
			l := testL2(t, n, now)
			if got := l.announce(now, leases, svcs, eps); len(got) > 0 {
				who = append(who, n)
			}
		}
		if len(who) > 1 {
			t.Fatalf("both nodes announce: %v", who)
		}
		return strings.Join(who, "")
	}
	for _, c := range []struct {
		what string
		eps  []*discoveryv1.EndpointSlice
		want string
	}{
		{"two on b, one on a", slice(ep("a", true), ep("b", true), ep("b", true)), "b"},
		{"one each (the hash)", slice(ep("a", true), ep("b", true)), "a"},
		{"two on a, one on b", slice(ep("a", true), ep("a", true), ep("b", true)), "a"},
		{"b's second not ready", slice(ep("a", true), ep("b", true), ep("b", false)), "a"},
		{"none ready", slice(ep("a", false), ep("b", false)), ""},
	} {
		if got := announcer(c.eps); got != c.want {
			t.Errorf("%s: announced by %q, want %q", c.what, got, c.want)
		}
	}
}
