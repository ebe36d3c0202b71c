package lbipam

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

const poolsDoc = `
pools:
- name: a-public
  addresses: ["192.0.2.0/30", "2001:db8::10-2001:db8::11"]
  namespaceSelector: {matchLabels: {team: web}}
- name: b-default
  addresses: ["198.51.100.10-198.51.100.11"]
- name: c-tagged
  addresses: ["203.0.113.7/32"]
  serviceSelector: {matchExpressions: [{key: tier, operator: In, values: [edge]}]}
`

func mustPools(t *testing.T, doc string) []*Pool {
	t.Helper()
	p, err := ParsePools(doc)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

var (
	v4   = []corev1.IPFamily{corev1.IPv4Protocol}
	v6   = []corev1.IPFamily{corev1.IPv6Protocol}
	dual = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
	web  = labels.Set{"team": "web"}
	t0   = time.Unix(1000, 0)
)

func want(key string, age int, fams []corev1.IPFamily, ns labels.Set) Want {
	return Want{Key: key, Created: t0.Add(time.Duration(age) * time.Second), Families: fams, Subject: Subject{Namespace: ns}}
}

func TestPlan(t *testing.T) {
	pools := mustPools(t, poolsDoc)
	edge := want("ns/edge", 5, v4, nil)
	edge.Subject.Service = labels.Set{"tier": "edge"}
	reqWeb := want("web/req", 3, nil, web)
	reqWeb.Requested = addrs("192.0.2.2")
	reqTaken := want("web/late", 9, v4, web)
	reqTaken.Requested = addrs("192.0.2.1")
	reqOutside := want("web/out", 9, v4, web)
	reqOutside.Requested = addrs("10.0.0.1")
	reqForeign := want("x/foreign", 9, v4, nil)
	reqForeign.Requested = addrs("192.0.2.2")
	held := want("web/held", 7, v4, web)
	held.Current = addrs("192.0.2.1")
	heldTwice := want("web/dup", 8, v4, web) // a status copied from web/held
	heldTwice.Current = addrs("192.0.2.1")
	sixOnly := want("other/v6", 1, v6, nil)
	twoV4 := want("web/two", 9, v4, web)
	twoV4.Requested = addrs("192.0.2.1", "192.0.2.2")

	for _, tc := range []struct {
		name   string
		wants  []Want
		expect map[string]string // key -> "addr,addr" or "!Reason"
	}{
		{"dual-stack in family order, namespace pool first", []Want{want("web/a", 1, dual, web)},
			map[string]string{"web/a": "2001:db8::10,192.0.2.1"}},
		{"no selector match: the default pool", []Want{want("other/a", 1, v4, nil)},
			map[string]string{"other/a": "198.51.100.10"}},
		{"service selector", []Want{edge}, map[string]string{"ns/edge": "198.51.100.10"}},
		{"exhausted: third Service of a two-address pool", []Want{
			want("o/a", 1, v4, nil), want("o/b", 2, v4, nil), want("o/c", 3, v4, nil)},
			map[string]string{"o/a": "198.51.100.10", "o/b": "198.51.100.11", "o/c": "!" + ReasonExhausted}},
		{"no pool of the family", []Want{sixOnly}, map[string]string{"other/v6": "!" + ReasonNoPool}},
		{"requested address", []Want{want("web/a", 1, v4, web), reqWeb},
			map[string]string{"web/a": "192.0.2.1", "web/req": "192.0.2.2"}},
		{"requested address already held: conflict, holder keeps it", []Want{held, reqTaken},
			map[string]string{"web/held": "192.0.2.1", "web/late": "!" + ReasonConflict}},
		{"requested address outside every pool", []Want{reqOutside}, map[string]string{"web/out": "!" + ReasonNotInPool}},
		{"requested address in a pool whose selector refuses the Service", []Want{reqForeign},
			map[string]string{"x/foreign": "!" + ReasonNotInPool}},
		{"two addresses of one family requested", []Want{twoV4}, map[string]string{"web/two": "!" + ReasonInvalid}},
		{"restart: current assignments kept, a copy of one is not", []Want{heldTwice, want("web/new", 1, v4, web), held},
			map[string]string{"web/held": "192.0.2.1", "web/new": "192.0.2.2", "web/dup": "198.51.100.10"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Plan(pools, tc.wants)
			for k, exp := range tc.expect {
				r := got[k]
				s := joinAddrs(r.Addrs)
				if strings.HasPrefix(exp, "!") {
					if r.Err == nil || r.Err.Reason != exp[1:] {
						t.Errorf("%s: got %q err %v, want error %s", k, s, r.Err, exp[1:])
					}
					continue
				}
				if r.Err != nil || s != exp {
					t.Errorf("%s: got %q err %v, want %s", k, s, r.Err, exp)
				}
			}
			// Never one address for two Services.
			owner := map[netip.Addr]string{}
			for k, r := range got {
				for _, a := range r.Addrs {
					if o, ok := owner[a]; ok {
						t.Errorf("%s assigned to %s and %s", a, o, k)
					}
					owner[a] = k
				}
			}
		})
	}
}

// A leader that restarts plans from the Services' status alone: feeding a
// plan's output back as Current, with the Services in any order and a
// Service deleted (released), moves nobody and reuses only the freed address.
func TestPlanRestartAndRelease(t *testing.T) {
	pools := mustPools(t, poolsDoc)
	ws := []Want{want("o/a", 1, v4, nil), want("o/b", 2, v4, nil), want("web/c", 3, dual, web), want("web/d", 4, v4, web)}
	first := Plan(pools, ws)
	for i := range ws {
		ws[i].Current = first[ws[i].Key].Addrs
	}
	slices.Reverse(ws)
	again := Plan(pools, ws)
	for _, w := range ws {
		if joinAddrs(again[w.Key].Addrs) != joinAddrs(first[w.Key].Addrs) {
			t.Errorf("%s moved: %v -> %v", w.Key, first[w.Key].Addrs, again[w.Key].Addrs)
		}
	}
	// Delete o/a; a new Service gets its address, o/b keeps its own.
	ws = slices.DeleteFunc(ws, func(w Want) bool { return w.Key == "o/a" })
	ws = append(ws, want("o/e", 9, v4, nil))
	third := Plan(pools, ws)
	if got, exp := joinAddrs(third["o/e"].Addrs), joinAddrs(first["o/a"].Addrs); got != exp {
		t.Errorf("o/e got %s, want the released %s", got, exp)
	}
	if got, exp := joinAddrs(third["o/b"].Addrs), joinAddrs(first["o/b"].Addrs); got != exp {
		t.Errorf("o/b moved %s -> %s", exp, got)
	}
}

func TestParsePoolsErrors(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"pools: [{name: a, addresses: ['192.0.2.0/24']}, {name: b, addresses: ['192.0.2.7/32']}]", "overlaps pool"},
		{"pools: [{name: a, addresses: ['192.0.2.1/24']}]", "host bits"},
		{"pools: [{name: a, addresses: ['192.0.2.9-192.0.2.1']}]", "last address before first"},
		{"pools: [{name: a, addresses: ['192.0.2.1-2001:db8::1']}]", "one family"},
		{"pools: [{name: a, addresses: []}]", "no addresses"},
		{"pools: [{name: a, addresses: ['x']}]", "neither a CIDR"},
		{"pools: [{name: a, adresses: ['192.0.2.0/24']}]", "unknown field"},
		{"pools: [{name: a, addresses: ['192.0.2.0/24'], serviceSelector: {matchExpressions: [{key: k, operator: Bogus}]}}]", "serviceSelector"},
		{"pools: [{name: a, addresses: ['192.0.2.0/28']}, {name: a, addresses: ['192.0.3.0/28']}]", "named twice"},
	} {
		if _, err := ParsePools(tc.doc); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error with %q", tc.doc, err, tc.want)
		}
	}
	r, err := ParseRange("192.0.2.0/30")
	if err != nil || r.First != netip.MustParseAddr("192.0.2.1") || r.Last != netip.MustParseAddr("192.0.2.2") {
		t.Errorf("192.0.2.0/30 = %v %v, want 192.0.2.1-192.0.2.2", r, err)
	}
	r, err = ParseRange("2001:db8::/127")
	if err != nil || r.First != netip.MustParseAddr("2001:db8::") || r.Last != netip.MustParseAddr("2001:db8::1") {
		t.Errorf("2001:db8::/127 = %v %v", r, err)
	}
}

func TestWantOf(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "n", Name: "s",
		Annotations: map[string]string{AnnotationIPs: "192.0.2.1, 2001:db8::10"}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerIP: "192.0.2.99", IPFamilies: dual}}
	w, err := wantOf(svc, nil)
	if err != nil || joinAddrs(w.Requested) != "192.0.2.1,2001:db8::10" {
		t.Errorf("annotation: %v %v", w.Requested, err)
	}
	svc.Annotations = nil
	if w, _ = wantOf(svc, nil); joinAddrs(w.Requested) != "192.0.2.99" {
		t.Errorf("loadBalancerIP: %v", w.Requested)
	}
	svc.Spec.LoadBalancerIP = "nope"
	if _, err = wantOf(svc, nil); err == nil || err.Reason != ReasonInvalid {
		t.Errorf("bad request: %v", err)
	}
	// Status addresses count only with lanekit's condition.
	svc.Spec.LoadBalancerIP = ""
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.5"}}
	if w, _ = wantOf(svc, nil); len(w.Current) != 0 {
		t.Errorf("foreign status taken as lanekit's: %v", w.Current)
	}
	svc.Status.Conditions = []metav1.Condition{{Type: ConditionType, Status: metav1.ConditionTrue}}
	if w, _ = wantOf(svc, nil); joinAddrs(w.Current) != "192.0.2.5" {
		t.Errorf("current: %v", w.Current)
	}
	other := "example.com/lb"
	svc.Spec.LoadBalancerClass = &other
	if Ours(svc) {
		t.Error("a Service of another loadBalancerClass is lanekit's")
	}
}

// A range's CIDR cover: exact (every address of the range in one prefix,
// nothing outside), shortest, both families, up to the family's end.
func TestRangePrefixes(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"10.77.0.200-10.77.0.239", "10.77.0.200/29 10.77.0.208/28 10.77.0.224/28"},
		{"10.0.0.0/24", "10.0.0.1/32 10.0.0.2/31 10.0.0.4/30 10.0.0.8/29 10.0.0.16/28 10.0.0.32/27 10.0.0.64/26 10.0.0.128/26 10.0.0.192/27 10.0.0.224/28 10.0.0.240/29 10.0.0.248/30 10.0.0.252/31 10.0.0.254/32"},
		{"192.0.2.7-192.0.2.7", "192.0.2.7/32"},
		{"0.0.0.0-255.255.255.255", "0.0.0.0/0"},
		{"255.255.255.254-255.255.255.255", "255.255.255.254/31"},
		{"fd00::1-fd00::ff", "fd00::1/128 fd00::2/127 fd00::4/126 fd00::8/125 fd00::10/124 fd00::20/123 fd00::40/122 fd00::80/121"},
	} {
		r, err := ParseRange(c.in)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, p := range r.Prefixes() {
			got = append(got, p.String())
		}
		if strings.Join(got, " ") != c.want {
			t.Errorf("%s: %v, want %s", c.in, got, c.want)
		}
	}
}
