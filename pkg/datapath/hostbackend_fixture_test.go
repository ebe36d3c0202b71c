package datapath

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/lanekit/lanekit/pkg/service"
)

// TestHostBackendReplyIntoTunnel: in tunnel mode a remote pod reaches a
// NodePort whose backend is this node's own address (a hostNetwork
// endpoint); the node's reply goes to the pod's node through the tunnel
// device, and to_tunnel gives it the NodePort's address before keying it.
func TestHostBackendReplyIntoTunnel(t *testing.T) {
	e, vx := tunnelFixtureEnv(t)
	e.enter(t)
	m := service.NewModel(service.Options{NodeAddrs: []netip.Addr{netip.MustParseAddr("10.77.0.1")}})
	applyYAML(t, e.dp, m, service.NewTables(), svcYAML("hostnp", "10.96.0.116", 80, "TCP", "nodePort=30096", "10.77.0.1"))
	run := func(prog *ebpf.Program, ifindex int, in []byte) (uint32, []byte) {
		t.Helper()
		opts := &ebpf.RunOptions{Data: bytes.Clone(in), DataOut: make([]byte, len(in)+64), Context: skbCtx{Ifindex: uint32(ifindex)}}
		ret, err := prog.Run(opts)
		if err != nil {
			t.Fatal(err)
		}
		return ret, opts.DataOut
	}
	syn := l4Frame(e.up.Attrs().HardwareAddr, neighMAC, "10.244.5.7", 40000, "10.77.0.1", 30096, 6, tcpSYN, 1, 0, nil)
	ret, out := run(e.dp.uplink.FromUplink, e.up.Attrs().Index, syn)
	if got := parseTuple(t, out); ret != tcActOK || got.dst != ap("10.77.0.1:8080") || got.src != ap("10.244.5.7:40000") {
		t.Fatalf("NodePort: verdict %d, %s -> %s; want 10.244.5.7:40000 -> 10.77.0.1:8080 to the stack", ret, got.src, got.dst)
	}
	reply := l4Frame(TunnelMAC, TunnelMAC, "10.77.0.1", 8080, "10.244.5.7", 40000, 6, tcpSYN|tcpACK, 9, 2, nil)
	ret, out = run(e.dp.uplink.ToTunnel, vx.Attrs().Index, reply)
	if got := parseTuple(t, out); ret != tcActOK || got.src != ap("10.77.0.1:30096") || got.dst != ap("10.244.5.7:40000") {
		t.Fatalf("reply into the tunnel: verdict %d, %s -> %s; want 10.77.0.1:30096 -> 10.244.5.7:40000", ret, got.src, got.dst)
	}
}
