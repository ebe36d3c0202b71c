package agent

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/service"
)

// refuseSvc is a ClusterIP Service with one TCP port and a creation time.
func refuseSvc(name, ip, created string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %s, namespace: shop, creationTimestamp: %q}
spec: {clusterIP: %s, ports: [{name: http, port: 80, targetPort: 8080}]}
`, name, created, ip)
}

func refusedKeys(rs []Refusal) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Object.Key())
	}
	slices.Sort(out)
	return out
}

func objectKeys(objs []k8sobj.Object) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.Key())
	}
	return out
}

func ownerOf(a *Agent, ip string) string {
	for _, f := range a.Frontends() {
		if f.Key.Addr.String() == ip && f.Key.Port == 80 && f.Key.Scope == service.ScopeClusterIP {
			return f.Service.Name
		}
	}
	return ""
}

func reversed[T any](s []T) []T {
	out := slices.Clone(s)
	slices.Reverse(out)
	return out
}

// programmed: the datapath has the ClusterIP frontend ip:80/TCP.
func programmed(dp *agenttest.MemoryDatapath, ip string) bool {
	u, _ := dp.DumpServices()
	_, ok := u.Services[svcKey(ip, 80, service.ScopeClusterIP)]
	return ok
}

// Two Services claim one frontend: the older one keeps it (by
// creationTimestamp, not by name or input order), the other is refused on
// its own with an invalid object and a duplicate, and everything else
// applies; the refusals are counted until the clash is gone.
func TestReplaceRefusesPerObject(t *testing.T) {
	dp := agenttest.NewMemoryDatapath()
	a := newCtlAgent(t, t.TempDir(), dp)
	// "a-new" held the frontend before (applied alone): the replace's
	// decision by age takes it away.
	newer := refuseSvc("a-new", "10.96.0.20", "2026-02-01T00:00:00Z")
	if err := a.UpsertObjects(decodeObjs(t, newer)); err != nil {
		t.Fatal(err)
	}
	older := refuseSvc("z-old", "10.96.0.20", "2026-01-01T00:00:00Z")
	ok := refuseSvc("ok", "10.96.0.21", "2026-03-01T00:00:00Z")
	objs := decodeObjs(t, newer+"---\n"+ok+"---\n"+older)
	bad := decodeObjs(t, ok)[0]
	bad.Service = bad.Service.DeepCopy()
	bad.Service.Name, bad.Service.Spec.ClusterIP = "bad", "not-an-ip"
	objs = append(objs, bad, objs[1]) // an invalid one and "ok" twice

	wantRefused := []string{"Service/shop/a-new", "Service/shop/bad", "Service/shop/ok"}
	for _, order := range [][]k8sobj.Object{objs, reversed(objs)} {
		rs, err := a.ReplaceObjects(k8sobj.KindService, order)
		if err != nil {
			t.Fatalf("replace: %v", err)
		}
		if got := refusedKeys(rs); !slices.Equal(got, wantRefused) {
			t.Fatalf("refused %v, want %v", got, wantRefused)
		}
		for _, r := range rs {
			if !errors.Is(r.Err, ErrInvalid) || !strings.Contains(r.Err.Error(), r.Object.Name()) {
				t.Errorf("refusal of %s: %v (want ErrInvalid naming it)", r.Object, r.Err)
			}
			by := []string{r.Object.Key()}
			if r.Object.Name() == "a-new" {
				if !strings.Contains(r.Err.Error(), "shop/z-old") {
					t.Errorf("clash refusal does not name the holder: %v", r.Err)
				}
				by = []string{"Service/shop/a-new", "Service/shop/z-old"}
			}
			if !slices.Equal(r.By, by) {
				t.Errorf("refusal of %s settles with %v, want %v", r.Object, r.By, by)
			}
		}
		if got := objectKeys(a.Objects(k8sobj.KindService)); !slices.Equal(got, []string{"Service/shop/ok", "Service/shop/z-old"}) {
			t.Errorf("services after replace: %v", got)
		}
		if o := ownerOf(a, "10.96.0.20"); o != "z-old" {
			t.Errorf("10.96.0.20:80 belongs to %q, want the older z-old", o)
		}
		if ownerOf(a, "10.96.0.21") != "ok" || !programmed(dp, "10.96.0.21") || !programmed(dp, "10.96.0.20") {
			t.Error("the valid services are not programmed")
		}
		if st := a.ControlStats(); st.Refused[k8sobj.KindService] != 3 {
			t.Errorf("ControlStats.Refused = %v, want 3 Services", st.Refused)
		}
	}
	if got := refusedKeys(a.Refused()); !slices.Equal(got, wantRefused) {
		t.Errorf("Refused() = %v", got)
	}

	// The older one goes: the next replace takes the newer one.
	rs, err := a.ReplaceObjects(k8sobj.KindService, decodeObjs(t, newer+"---\n"+ok))
	if err != nil || len(rs) != 0 {
		t.Fatalf("replace without the clash: %v, %v", refusedKeys(rs), err)
	}
	if o := ownerOf(a, "10.96.0.20"); o != "a-new" {
		t.Errorf("10.96.0.20:80 belongs to %q after z-old went, want a-new", o)
	}
	if st := a.ControlStats(); st.Refused[k8sobj.KindService] != 0 {
		t.Errorf("refusals left: %v", st.Refused)
	}

	// A refusal is settled by an upsert or a delete of the object.
	if rs, err := a.ReplaceObjects(k8sobj.KindService, decodeObjs(t, newer+"---\n"+older)); err != nil || len(rs) != 1 {
		t.Fatalf("replace: %v, %v", refusedKeys(rs), err)
	}
	if err := a.UpsertObjects(decodeObjs(t, newer)); !errors.Is(err, ErrInvalid) {
		t.Errorf("upsert of the newer clashing service: %v, want ErrInvalid", err)
	}
	if err := a.DeleteObject(k8sobj.KindService, "shop", "z-old"); err != nil {
		t.Fatal(err)
	}
	if err := a.UpsertObjects(decodeObjs(t, newer)); err != nil {
		t.Fatal(err)
	}
	if len(a.Refused()) != 0 || ownerOf(a, "10.96.0.20") != "a-new" {
		t.Errorf("after the upsert: refused %v, owner %q", refusedKeys(a.Refused()), ownerOf(a, "10.96.0.20"))
	}
}

// BenchmarkReplaceServicesAt10k: the full set of 10,000 Services handed to
// the agent again (the k8s source's resync), without and with one Service
// claiming another's frontend (refused on its own).
func BenchmarkReplaceServicesAt10k(b *testing.B) {
	for _, clash := range []bool{false, true} {
		b.Run(fmt.Sprintf("clash=%v", clash), func(b *testing.B) {
			a := newCtlAgent(b, b.TempDir(), agenttest.NewMemoryDatapath())
			objs := benchServiceObjects(10000)
			for i := 0; i < len(objs); i += 2000 {
				if err := a.UpsertObjects(objs[i:min(i+2000, len(objs))]); err != nil {
					b.Fatal(err)
				}
			}
			var svcs []k8sobj.Object
			for i := 0; i < len(objs); i += 2 {
				svcs = append(svcs, objs[i])
			}
			if clash {
				dup := svcs[0]
				dup.Service = dup.Service.DeepCopy()
				dup.Service.Name = "zz-clash"
				svcs = append(svcs, dup)
			}
			b.ResetTimer()
			for range b.N {
				rs, err := a.ReplaceObjects(k8sobj.KindService, svcs)
				if err != nil || len(rs) != map[bool]int{false: 0, true: 1}[clash] {
					b.Fatal(len(rs), err)
				}
			}
		})
	}
}

// TestReplaceRefusesUnsupportedServices: a Service lanekit cannot program
// as written (a malformed loadBalancerSourceRanges entry: enforcing the
// others would let the Service open wider or narrower than its owner
// meant) is refused per object with the reason, never programmed half; a
// Service with an IPv6 external IP (an IPv4 Service: no IPv6 frontend to
// add it to), ExternalName and headless Services apply beside it.
func TestReplaceRefusesUnsupportedServices(t *testing.T) {
	a := newCtlAgent(t, t.TempDir(), agenttest.NewMemoryDatapath())
	objs := decodeObjs(t, refuseSvc("ok", "10.96.0.1", "2026-01-01T00:00:00Z")+"---\n"+
		refuseSvc("ranges", "10.96.0.2", "2026-01-01T00:00:00Z")+"---\n"+
		refuseSvc("v6ext", "10.96.0.3", "2026-01-01T00:00:00Z")+"---\n"+
		"apiVersion: v1\nkind: Service\nmetadata: {name: alias, namespace: shop}\nspec: {type: ExternalName, externalName: db.example.com}\n---\n"+
		"apiVersion: v1\nkind: Service\nmetadata: {name: headless, namespace: shop}\nspec: {clusterIP: None}\n")
	objs[1].Service.Spec.Type = corev1.ServiceTypeLoadBalancer
	objs[1].Service.Spec.Ports[0].NodePort = 30080
	objs[1].Service.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/8", "10.0.0.0/33"}
	objs[2].Service.Spec.ExternalIPs = []string{"2001:db8::1"}
	refused, err := a.ReplaceObjects(k8sobj.KindService, objs)
	if err != nil {
		t.Fatal(err)
	}
	if got := refusedKeys(refused); !slices.Equal(got, []string{"Service/shop/ranges"}) {
		t.Fatalf("refused %v", got)
	}
	for _, r := range refused {
		if !strings.Contains(r.Err.Error(), "spec.loadBalancerSourceRanges[1]") || !strings.Contains(r.Err.Error(), "valid CIDR") || !errors.Is(r.Err, ErrInvalid) {
			t.Errorf("%s: reason %q", r.Object.Key(), r.Err)
		}
	}
	if ownerOf(a, "10.96.0.1") != "ok" || ownerOf(a, "10.96.0.2") != "" {
		t.Fatalf("owners: %q %q", ownerOf(a, "10.96.0.1"), ownerOf(a, "10.96.0.2"))
	}
	if got := a.ctl.model.Services(); len(got) != 4 {
		t.Fatalf("services in the model %v; want ok, v6ext, alias, headless", got)
	}
}
