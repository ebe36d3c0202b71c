package agent

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev"
)

func TestParseTunnelNode(t *testing.T) {
	n, err := ParseTunnelNode("10.244.2.7/24=10.77.0.2")
	if err != nil || n.PodCIDR.String() != "10.244.2.0/24" || n.Underlay.String() != "10.77.0.2" {
		t.Fatalf("%+v, %v", n, err)
	}
	for _, bad := range []string{"", "10.244.2.0/24", "10.244.2.0/24=x", "fd00::/64=10.0.0.1", "10.244.2.0/24=fd00::1"} {
		if _, err := ParseTunnelNode(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestCheckEncryption(t *testing.T) {
	none := EncryptionFeatures{IPsec: netdev.Feature{Detail: "ESP: function not implemented"}, WireGuard: netdev.Feature{Detail: "wireguard: not supported"}}
	if err := checkEncryption("", none); err != nil {
		t.Fatal(err)
	}
	if err := checkEncryption(EncryptionNone, none); err != nil {
		t.Fatal(err)
	}
	err := checkEncryption(EncryptionIPsec, none)
	if !errors.Is(err, datapath.ErrNotSupported) || !strings.Contains(err.Error(), "function not implemented") {
		t.Fatalf("ipsec without ESP: %v", err)
	}
	if err := checkEncryption(EncryptionWireGuard, none); !errors.Is(err, datapath.ErrNotSupported) {
		t.Fatalf("wireguard without the module: %v", err)
	}
	has := EncryptionFeatures{WireGuard: netdev.Feature{Supported: true, Detail: "created"}}
	if err := checkEncryption(EncryptionWireGuard, has); err == nil || !strings.Contains(err.Error(), "does not implement") {
		t.Fatalf("wireguard present: %v", err)
	}
	if err := checkEncryption("aes", none); err == nil || !strings.Contains(err.Error(), "unknown encryption") {
		t.Fatalf("unknown: %v", err)
	}
}

// TestTunnelModeRefusesEncryption: an agent asked for encryption does not
// start, with the kernel's reason (this kernel has neither ESP nor
// WireGuard; where it has one, lanekit still refuses).
func TestTunnelModeRefusesEncryption(t *testing.T) {
	fx := newFixture(t)
	_, err := fx.startCfg(t, newFake(), func(c *Config) { c.Encryption = EncryptionIPsec })
	if err == nil || !strings.Contains(err.Error(), "--encryption ipsec") {
		t.Fatalf("agent with --encryption ipsec: %v", err)
	}
}

// TestTunnelModeDevice: in tunnel mode the agent creates the collect_md
// VXLAN device (NOARP, the tunnel MAC, the pod MTU) in the node namespace and
// refuses a pod MTU the tunnel cannot carry.
func TestTunnelModeDevice(t *testing.T) {
	fx := newFixture(t)
	fx.nodeNS.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0", MTU: 1400}, PeerName: "up0p"}); err != nil {
			t.Fatal(err)
		}
		return nil
	})
	if _, err := fx.startCfg(t, newFake(), func(c *Config) { c.RoutingMode, c.Uplink = RoutingTunnel, "up0" }); err == nil ||
		!strings.Contains(err.Error(), "tunnel mode fits at most 1350") {
		t.Fatalf("--mtu 1400 over a 1400 uplink in tunnel mode: %v", err)
	}
	a, err := fx.startCfg(t, newFake(), func(c *Config) { c.RoutingMode, c.Uplink, c.MTU, c.TunnelPort = RoutingTunnel, "up0", 0, 4789 })
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if r := a.routingInfo(); r.Mode != RoutingTunnel || r.Device != TunnelDevice || r.Port != 4789 || r.PodMTU != 1350 {
		t.Fatalf("routing %+v", r)
	}
	fx.nodeNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(TunnelDevice)
		if err != nil {
			t.Fatalf("no %s: %v", TunnelDevice, err)
		}
		vx, ok := l.(*netlink.Vxlan)
		if !ok || !vx.FlowBased || vx.Port != 4789 || vx.MTU != 1350 || vx.Flags&net.FlagUp == 0 ||
			vx.RawFlags&unix.IFF_NOARP == 0 || vx.HardwareAddr.String() != datapath.TunnelMAC.String() {
			t.Fatalf("%s: %+v", TunnelDevice, l.Attrs())
		}
		return nil
	})
}

func (fx *fixture) startCfg(t *testing.T, dp datapath.Datapath, adjust func(*Config)) (*Agent, error) {
	t.Helper()
	cfg := Config{
		StateDir: fx.stateDir, Socket: filepath.Join(fx.stateDir, "agent.sock"),
		PodCIDR: netip.MustParsePrefix("10.77.0.0/28"),
		MTU:     1400, HostNetns: fx.nodeNS.Path(),
		OpenDatapath: func(datapath.Config, *slog.Logger) (datapath.Datapath, error) { return dp, nil },
	}
	adjust(&cfg)
	return New(cfg, quietLog())
}

// TestTunnelRoutesSource: the routes into the tunnel device (the node's own
// traffic to other nodes' pods) prefer the node's address towards each
// peer's underlay address, the outer source its VXLAN gets, even where
// another device's address comes first: the peer's from_tunnel accepts the
// node's own packets as inner source = outer source. A claim's /32 too.
func TestTunnelRoutesSource(t *testing.T) {
	fx := newFixture(t)
	fx.nodeNS.Do(func(ns.NetNS) error {
		for _, d := range [][2]string{{"oth0", "10.99.0.1/32"}, {"up0", "10.77.0.1/24"}} {
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: d[0]}, PeerName: d[0] + "p"}); err != nil {
				t.Fatal(err)
			}
			l, err := netlink.LinkByName(d[0])
			if err != nil {
				t.Fatal(err)
			}
			addr, _ := netlink.ParseAddr(d[1])
			if err := netlink.AddrAdd(l, addr); err != nil {
				t.Fatal(err)
			}
			if err := netlink.LinkSetUp(l); err != nil {
				t.Fatal(err)
			}
		}
		if err := ensureVXLAN(DefaultTunnelPort, 1450); err != nil {
			t.Fatal(err)
		}
		peers := []datapath.TunnelNode{
			{PodCIDR: netip.MustParsePrefix("10.244.2.0/24"), Underlay: netip.MustParseAddr("10.77.0.2")},
			{PodCIDR: netip.MustParsePrefix("10.244.1.99/32"), Underlay: netip.MustParseAddr("10.77.0.2"), Claim: true},
		}
		if err := syncTunnelRoutes(peers); err != nil {
			t.Fatal(err)
		}
		l, err := netlink.LinkByName(TunnelDevice)
		if err != nil {
			t.Fatal(err)
		}
		rs, err := netlink.RouteList(l, netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != 2 {
			t.Fatalf("routes into %s: %v, want 2", TunnelDevice, rs)
		}
		for _, r := range rs {
			if r.Src.String() != "10.77.0.1" {
				t.Errorf("route %s dev %s: source %v, want 10.77.0.1 (towards the peer's underlay)", r.Dst, TunnelDevice, r.Src)
			}
		}
		return nil
	})
}

// TestEnsureVXLANSourcePortRange: the tunnel device gets an outer source
// port range of its own, the node namespace's local port range when it is
// made (the programs' encapsulation draws from the device's range); a
// device without one (an older agent's) is re-created with it; a later
// change of the sysctl leaves the device, and its range, as they are.
func TestEnsureVXLANSourcePortRange(t *testing.T) {
	fx := newFixture(t)
	const key = "/proc/sys/net/ipv4/ip_local_port_range"
	fx.nodeNS.Do(func(ns.NetNS) error {
		setRange := func(r string) {
			t.Helper()
			if err := os.WriteFile(key, []byte(r), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		device := func() *netlink.Vxlan {
			t.Helper()
			l, err := netlink.LinkByName(TunnelDevice)
			if err != nil {
				t.Fatal(err)
			}
			vx, ok := l.(*netlink.Vxlan)
			if !ok {
				t.Fatalf("%s is a %s", TunnelDevice, l.Type())
			}
			return vx
		}
		// An older agent's device: no range of its own.
		if err := netlink.LinkAdd(&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: TunnelDevice}, FlowBased: true, Port: DefaultTunnelPort}); err != nil {
			t.Fatal(err)
		}
		old := device().Index
		setRange("40000 50000")
		if err := ensureVXLAN(DefaultTunnelPort, 1450); err != nil {
			t.Fatal(err)
		}
		vx := device()
		if vx.PortLow != 40000 || vx.PortHigh != 50000 || vx.Index == old {
			t.Fatalf("device %d range %d-%d, want re-created (not %d) with 40000-50000", vx.Index, vx.PortLow, vx.PortHigh, old)
		}
		setRange("20000 24999")
		if err := ensureVXLAN(DefaultTunnelPort, 1450); err != nil {
			t.Fatal(err)
		}
		if again := device(); again.Index != vx.Index || again.PortLow != 40000 || again.PortHigh != 50000 {
			t.Fatalf("after the sysctl changed: device %d range %d-%d, want %d kept with 40000-50000", again.Index, again.PortLow, again.PortHigh, vx.Index)
		}
		return nil
	})
}
