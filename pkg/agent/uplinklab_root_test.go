package agent

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

// uplinkLab is a real agent on the BPF datapath (pod CIDRs 10.77.0.0/28 and
// fd00:77::/64) whose node has an uplink, bwup0 (192.168.77.1,
// fd00:78::1), to a "remote" host namespace (uplinkRemote, uplinkRemote6)
// that routes the pod CIDRs back to the node.
type uplinkLab struct {
	a      *Agent
	dp     *datapath.Loader
	node   ns.NetNS
	remote ns.NetNS
}

const (
	uplinkRemote  = "192.168.77.2"
	uplinkRemote6 = "fd00:78::2"
)

func startUplinkLab(tb testing.TB, tweak func(*Config)) *uplinkLab {
	fx := newFixture(tb)
	l := &uplinkLab{node: fx.nodeNS, remote: netnstest.New(tb, "remote")}
	addrs := func(link netlink.Link, cidrs ...string) error {
		for _, c := range cidrs {
			a, err := netlink.ParseAddr(c)
			if err != nil {
				return err
			}
			a.Flags = unix.IFA_F_NODAD
			if err := netlink.AddrAdd(link, a); err != nil {
				return fmt.Errorf("%s: %w", c, err)
			}
		}
		return netlink.LinkSetUp(link)
	}
	if err := l.node.Do(func(ns.NetNS) error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "bwup0"}, PeerName: "bwrem0", PeerNamespace: netlink.NsFd(int(l.remote.Fd()))}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		up, err := netlink.LinkByName("bwup0")
		if err != nil {
			return err
		}
		return addrs(up, "192.168.77.1/24", "fd00:78::1/64")
	}); err != nil {
		tb.Fatal(err)
	}
	if err := l.remote.Do(func(ns.NetNS) error {
		rem, err := netlink.LinkByName("bwrem0")
		if err != nil {
			return err
		}
		if err := addrs(rem, uplinkRemote+"/24", uplinkRemote6+"/64"); err != nil {
			return err
		}
		for dst, gw := range map[string]string{"10.77.0.0/28": "192.168.77.1", "fd00:77::/64": "fd00:78::1"} {
			_, d, _ := net.ParseCIDR(dst)
			if err := netlink.RouteAdd(&netlink.Route{Dst: d, Gw: net.ParseIP(gw), LinkIndex: rem.Attrs().Index}); err != nil {
				return fmt.Errorf("route %s: %w", dst, err)
			}
		}
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	pins := filepath.Join("/sys/fs/bpf", fmt.Sprintf("lk-t-agent-up-%d", os.Getpid()))
	tb.Cleanup(func() { datapath.Unpin(pins) })
	cfg := Config{
		StateDir: fx.stateDir, Socket: filepath.Join(fx.stateDir, "agent.sock"),
		PodCIDR: netip.MustParsePrefix("10.77.0.0/28"), PodCIDR6: netip.MustParsePrefix("fd00:77::/64"),
		MTU: 1500, HostNetns: fx.nodeNS.Path(), BPFDir: pins, Uplink: "bwup0",
		OpenDatapath: func(c datapath.Config, log *slog.Logger) (datapath.Datapath, error) {
			d, err := datapath.Open(c, log)
			l.dp = d
			return d, err
		},
	}
	if tweak != nil {
		tweak(&cfg)
	}
	a, err := New(cfg, quietLog())
	if err != nil {
		tb.Fatalf("start agent with the BPF datapath: %v", err)
	}
	tb.Cleanup(func() { a.Close() })
	l.a = a
	return l
}
