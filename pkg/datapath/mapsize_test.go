package datapath

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/service"
)

// The service, policy and tunnel maps load with the configured sizes (every
// program sharing them: pod, uplink, socket LB), the kernel refuses an entry
// past them (which is why the agent's tables hold back what does not fit),
// and a restart with other sizes migrates them keeping their entries.
func TestMapSizes(t *testing.T) {
	testutil.RequireBPFFS(t)
	dir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("lk-t-lbsize-%d", os.Getpid()))
	t.Cleanup(func() { Unpin(dir) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	small := PolicySizes{IPCache: 8, CIDRs: 9, Identities: 10, Rules: 11, TunnelNodes: 12}
	l, err := Open(Config{PinDir: dir, LBFrontends: 4, LBBackends: 6, PolicyMaps: small}, log)
	if err != nil {
		t.Fatal(err)
	}
	sizes := func(want map[string]uint32) {
		t.Helper()
		for name, n := range want {
			m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), nil)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if m.MaxEntries() != n {
				t.Errorf("%s holds %d entries, want %d", name, m.MaxEntries(), n)
			}
			m.Close()
		}
	}
	want := map[string]uint32{}
	for _, n := range lbFrontendMaps {
		want[n] = 4
	}
	for _, n := range lbBackendMaps {
		want[n] = 6
	}
	policyWant := func(p PolicySizes) map[string]uint32 {
		w := map[string]uint32{}
		for _, g := range []struct {
			names []string
			n     int
		}{{policyIPCacheMaps, p.IPCache}, {policyCIDRMaps, p.CIDRs}, {policyIdentMaps, p.Identities},
			{policyRuleMaps, p.Rules}, {tunnelNodeMaps, p.TunnelNodes}} {
			for _, name := range g.names {
				w[name] = uint32(g.n)
			}
		}
		return w
	}
	sizes(want)
	sizes(policyWant(small))
	// The socket LB's programs share the maps: its spec gets the same sizes.
	sockSpec, err := loadSock()
	if err != nil {
		t.Fatal(err)
	}
	sizeMaps(sockSpec, l.cfg)
	for name, n := range want {
		if ms, ok := sockSpec.Maps[name]; ok && ms.MaxEntries != n {
			t.Errorf("socket LB spec: %s sized %d, want %d", name, ms.MaxEntries, n)
		}
	}

	front := func(i int) *service.Frontend {
		return &service.Frontend{Key: service.FrontendKey{Addr: netip.AddrFrom4([4]byte{10, 96, 0, byte(i)}), Port: 80, Proto: service.TCP},
			Service:  service.ServiceID{Namespace: "ns", Name: fmt.Sprint(i)},
			Backends: []service.Backend{{Addr: netip.AddrFrom4([4]byte{10, 244, 0, byte(i)}), Port: 8080}}}
	}
	tb := service.NewTables() // no capacity: what the kernel does at the edge
	var fs []*service.Frontend
	for i := 1; i <= 4; i++ {
		fs = append(fs, front(i))
	}
	if err := l.ApplyServices(tb.Apply(service.Changes{Upserted: fs})); err != nil {
		t.Fatalf("4 frontends into a map of 4: %v", err)
	}
	err = l.ApplyServices(tb.Apply(service.Changes{Upserted: []*service.Frontend{front(5)}}))
	if !errors.Is(err, unix.E2BIG) {
		t.Errorf("a 5th frontend into a map of 4: %v, want E2BIG", err)
	}
	l.Close()

	// Restart with the defaults: migrated, the 4 frontends kept.
	l, err = Open(Config{PinDir: dir}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, n := range lbFrontendMaps {
		want[n] = DefaultLBFrontends
	}
	for _, n := range lbBackendMaps {
		want[n] = DefaultLBBackends
	}
	sizes(want)
	sizes(policyWant(Config{}.PolicySizes()))
	if n, _ := countEntries(l.pod.LkLbSvc); n != 4 {
		t.Errorf("lk_lb_svc kept %d entries over the resize, want 4", n)
	}
}
