package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/ipam"
	"github.com/lanekit/lanekit/pkg/netdev"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
	"github.com/lanekit/lanekit/pkg/service"
	"github.com/lanekit/lanekit/pkg/store"
)

// countingHandler counts the log records by message.
type countingHandler struct {
	mu   sync.Mutex
	msgs map[string]int
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs[r.Message]++
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

func (h *countingHandler) count(prefix string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for m, c := range h.msgs {
		if strings.HasPrefix(m, prefix) {
			n += c
		}
	}
	return n
}

// newGuardAgent is newCtlAgent with the externalIPs policy and a log that
// counts messages.
func newGuardAgent(t *testing.T, dp *agenttest.MemoryDatapath, ext service.ExternalIPPolicy) (*Agent, *countingHandler) {
	t.Helper()
	return newGuardAgentIn(t, &netdev.Host{}, dp, ext)
}

// newGuardAgentIn is newGuardAgent whose node netns is host's.
func newGuardAgentIn(t *testing.T, host *netdev.Host, dp *agenttest.MemoryDatapath, ext service.ExternalIPPolicy) (*Agent, *countingHandler) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ip, err := ipam.New(st, ctlPodCIDR)
	if err != nil {
		t.Fatal(err)
	}
	h := &countingHandler{msgs: map[string]int{}}
	a := &Agent{cfg: Config{StateDir: dir, PodCIDR: ctlPodCIDR, NodeAddrs: []netip.Addr{ctlNodeAddr}, ExternalIPs: ext},
		log: slog.New(h), st: st, ipam: ip, host: host, dp: dp, backend: "test"}
	if err := a.restoreControlPlane(); err != nil {
		t.Fatal(err)
	}
	return a, h
}

// attackerPod declares hostPorts on addresses that are not the node's: the
// victim pod's (beside it), 169.254.169.254, the API server's Service, an
// address the node does not have yet; and one on the node's own address.
const attackerPod = `
apiVersion: v1
kind: Pod
metadata: {name: victim, namespace: shop}
spec: {nodeName: node-1, containers: [{name: c, image: x, ports: [{containerPort: 80}]}]}
status: {podIP: 10.244.1.6, phase: Running}
---
apiVersion: v1
kind: Pod
metadata: {name: attacker, namespace: evil}
spec:
  nodeName: node-1
  containers:
  - name: c
    image: x
    ports:
    - {containerPort: 8080, hostPort: 80, hostIP: 10.244.1.6}
    - {containerPort: 8080, hostPort: 80, hostIP: 169.254.169.254}
    - {containerPort: 8080, hostPort: 443, hostIP: 10.96.0.1}
    - {containerPort: 8080, hostPort: 80, hostIP: 10.99.0.5}
    - {containerPort: 8080, hostPort: 8000, hostIP: 192.168.50.1}
status: {podIP: 10.244.1.5, phase: Running}
`

// TestHostPortForeignHostIPAgent: through the agent, a pod's hostPorts on
// another pod's address, 169.254.169.254 and the API server's address are
// not programmed into the datapath (its service maps resolve nothing there)
// while its hostPort on the node's address is; each ignored port is logged
// once (not again when the pod is applied again or on a resync) and counted.
// When the node gains one of the addresses, the next resync programs that
// hostPort; when it loses it, the next resync removes it.
func TestHostPortForeignHostIPAgent(t *testing.T) {
	dp := agenttest.NewMemoryDatapath()
	a, logs := newGuardAgent(t, dp, service.ExternalIPPolicy{})
	a.syncServiceHostAddrs([]netip.Addr{ctlNodeAddr, netip.MustParseAddr("127.0.0.1")})
	for range 2 {
		if err := a.UpsertObjects(decodeObjs(t, attackerPod)); err != nil {
			t.Fatal(err)
		}
	}
	attacker := netip.MustParseAddrPort("10.244.1.5:8080")
	foreign := []service.ServiceKey{hpKey("10.244.1.6", 80, service.TCP), hpKey("169.254.169.254", 80, service.TCP),
		hpKey("10.96.0.1", 443, service.TCP), hpKey("10.99.0.5", 80, service.TCP)}
	for _, k := range foreign {
		if got, ok := dp.Resolve(k, 7); ok {
			t.Errorf("%v resolves to %v: a foreign hostIP is programmed", k, got)
		}
	}
	if got, ok := dp.Resolve(hpKey("192.168.50.1", 8000, service.TCP), 7); !ok || got != attacker {
		t.Errorf("the hostPort on the node's address resolves to %v %v, want %v", got, ok, attacker)
	}
	if n := logs.count("hostPort not programmed"); n != 4 {
		t.Errorf("%d log lines for the ignored hostPorts after applying the pod twice, want 4 (once per port)", n)
	}
	if st := a.ControlStats(); st.Ignored[service.ReasonHostIPNotNode] != 4 {
		t.Errorf("ignored %v, want 4 %s", st.Ignored, service.ReasonHostIPNotNode)
	}

	// The node gains 10.99.0.5: the next resync programs that hostPort, and
	// logs nothing new.
	a.syncServiceHostAddrs([]netip.Addr{netip.MustParseAddr("10.99.0.5"), ctlNodeAddr, netip.MustParseAddr("127.0.0.1")})
	if got, ok := dp.Resolve(foreign[3], 7); !ok || got != attacker {
		t.Errorf("after the node gained 10.99.0.5: %v -> %v %v, want %v", foreign[3], got, ok, attacker)
	}
	for _, k := range foreign[:3] {
		if _, ok := dp.Resolve(k, 7); ok {
			t.Errorf("after a resync %v is programmed", k)
		}
	}
	if n, st := logs.count("hostPort not programmed"), a.ControlStats(); n != 4 || st.Ignored[service.ReasonHostIPNotNode] != 3 {
		t.Errorf("after the resync: %d log lines (want still 4), ignored %v (want 3)", n, st.Ignored)
	}
	// ... and loses it again: gone at the next resync.
	a.syncServiceHostAddrs([]netip.Addr{ctlNodeAddr, netip.MustParseAddr("127.0.0.1")})
	if got, ok := dp.Resolve(foreign[3], 7); ok {
		t.Errorf("after the node lost 10.99.0.5: %v -> %v, want nothing", foreign[3], got)
	}
	// The pod goes: nothing is ignored any more.
	if err := a.DeleteObject("Pod", "evil", "attacker"); err != nil {
		t.Fatal(err)
	}
	if ig := a.Ignored(); len(ig) != 0 {
		t.Errorf("after the pod's deletion: ignored %v", ig)
	}
}

// TestExternalIPsGuardAgent: with --external-ips 203.0.113.0/24, a Service's
// externalIP outside it (here a pod's address, which would capture the
// node's connections to that pod) is not programmed, one inside is; the
// refusal is logged once per Service and counted.
func TestExternalIPsGuardAgent(t *testing.T) {
	dp := agenttest.NewMemoryDatapath()
	pol, err := service.ParseExternalIPPolicy("203.0.113.0/24")
	if err != nil {
		t.Fatal(err)
	}
	a, logs := newGuardAgent(t, dp, pol)
	const svc = `
apiVersion: v1
kind: Service
metadata: {name: grab, namespace: evil}
spec:
  clusterIP: 10.96.0.30
  externalIPs: [10.244.1.6, 203.0.113.5]
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: grab-1, namespace: evil, labels: {kubernetes.io/service-name: grab}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.5]}]
`
	for range 2 {
		if err := a.UpsertObjects(decodeObjs(t, svc)); err != nil {
			t.Fatal(err)
		}
	}
	be := netip.MustParseAddrPort("10.244.1.5:8080")
	if got, ok := dp.Resolve(hpKey("10.244.1.6", 80, service.TCP), 7); ok {
		t.Errorf("the externalIP outside --external-ips resolves to %v", got)
	}
	if got, ok := dp.Resolve(hpKey("203.0.113.5", 80, service.TCP), 7); !ok || got != be {
		t.Errorf("the allowed externalIP resolves to %v %v, want %v", got, ok, be)
	}
	clusterIP := service.ServiceKey{Addr: netip.MustParseAddr("10.96.0.30").As4(), Port: 80, Proto: uint8(service.TCP)}
	if got, ok := dp.Resolve(clusterIP, 7); !ok || got != be {
		t.Errorf("the cluster IP resolves to %v %v, want %v", got, ok, be)
	}
	if n, st := logs.count("externalIP not programmed"), a.ControlStats(); n != 1 || st.Ignored[service.ReasonExternalIPNotAllowed] != 1 {
		t.Errorf("%d log lines (want 1 for the Service applied twice), ignored %v (want 1)", n, st.Ignored)
	}
}

// TestHostPortFollowsNodeAddrs: the node's addresses come from its netns
// (every interface, as SyncHostAddrs lists them for the watcher and the
// maintenance loop): a hostPort on 10.99.0.5 is ignored while no interface
// of the node has it, programmed at the first resync after one gains it, and
// removed at the first resync after it is gone. Root (a node netns).
func TestHostPortFollowsNodeAddrs(t *testing.T) {
	testutil.RequireRoot(t)
	n := netnstest.New(t, "hpaddrs")
	h, err := netdev.NewHost(n.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	addr, _ := netlink.ParseAddr("10.99.0.5/32")
	onLink := func(f func(netlink.Link) error) {
		t.Helper()
		if err := h.Do(func() error {
			l, err := netlink.LinkByName("lk-hp-up")
			if err != nil {
				return err
			}
			return f(l)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.Do(func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lk-hp-up"}, PeerName: "lk-hp-peer"})
	}); err != nil {
		t.Fatal(err)
	}
	dp := agenttest.NewMemoryDatapath()
	a, _ := newGuardAgentIn(t, h, dp, service.ExternalIPPolicy{})
	if err := a.UpsertObjects(decodeObjs(t, attackerPod)); err != nil {
		t.Fatal(err)
	}
	key, attacker := hpKey("10.99.0.5", 80, service.TCP), netip.MustParseAddrPort("10.244.1.5:8080")
	if got, ok := dp.Resolve(key, 7); ok {
		t.Fatalf("before the node has 10.99.0.5: %v -> %v", key, got)
	}
	onLink(func(l netlink.Link) error { return netlink.AddrAdd(l, addr) })
	if err := a.SyncHostAddrs(); err != nil {
		t.Fatal(err)
	}
	if got, ok := dp.Resolve(key, 7); !ok || got != attacker {
		t.Errorf("after the node gained 10.99.0.5 and a resync: %v -> %v %v, want %v", key, got, ok, attacker)
	}
	if _, ok := dp.Resolve(hpKey("10.244.1.6", 80, service.TCP), 7); ok {
		t.Error("the hostPort on the victim's address is programmed after the resync")
	}
	onLink(func(l netlink.Link) error { return netlink.AddrDel(l, addr) })
	if err := a.SyncHostAddrs(); err != nil {
		t.Fatal(err)
	}
	if got, ok := dp.Resolve(key, 7); ok {
		t.Errorf("after the node lost 10.99.0.5 and a resync: %v -> %v, want nothing", key, got)
	}
}
