package bench

import (
	"net/netip"
	"testing"

	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/service"
)

// The objects lanekit's rows apply decode strictly and translate into the
// same frontends and backends the kube-proxy rules carry.
func TestSvcObjectsTranslate(t *testing.T) {
	set, err := NewSvcSet(50, svcUsedPorts, []netip.Addr{netip.MustParseAddr("10.244.2.2"), netip.MustParseAddr("10.244.2.3")},
		netip.MustParsePrefix("10.244.0.0/14"))
	if err != nil {
		t.Fatal(err)
	}
	data, err := set.ObjectsJSON(0, len(set.Services))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := k8sobj.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 100 {
		t.Fatalf("%d objects, want 100", len(objs))
	}
	svcs, slices, _ := k8sobj.Split(objs)
	m, err := service.Build(svcs, slices, service.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(m.Frontends()); got != 49+2 {
		t.Fatalf("%d frontends, want 51", got)
	}
	backends := 0
	for _, f := range m.Frontends() {
		backends += len(f.Backends)
	}
	if backends != set.Endpoints() {
		t.Errorf("%d backends, the rules carry %d endpoints", backends, set.Endpoints())
	}
	used := set.Services[set.Used]
	f := m.Frontend(service.FrontendKey{Addr: used.IP, Port: svcCPSPort, Proto: service.TCP, Scope: service.ScopeClusterIP})
	if f == nil || len(f.Backends) != 2 || f.Backends[0].Port != svcCPSPort || f.Eligible() != 2 {
		t.Fatalf("the client's cps frontend: %+v", f)
	}
	// One change: the slice alone, one endpoint fewer.
	ch := set.DefaultChange()
	without, _ := set.Without(ch)
	one, err := without.SliceJSON(ch.Service)
	if err != nil {
		t.Fatal(err)
	}
	objs, err = k8sobj.Decode(one)
	if err != nil || len(objs) != 1 || len(objs[0].EndpointSlice.Endpoints) != SvcEndpointsPerService-1 {
		t.Fatalf("one-change slice: %v, %+v", err, objs)
	}
	if _, err := set.ObjectsJSON(10, 5); err == nil {
		t.Error("a reversed range accepted")
	}
}
