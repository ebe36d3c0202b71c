package agent

import (
	"fmt"
	"net"
	"net/netip"
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
	l.a, l.dp = startBPFAgent(tb, fx, "up", func(c *Config) {
		c.PodCIDR6, c.MTU, c.Uplink = netip.MustParsePrefix("fd00:77::/64"), 1500, "bwup0"
		if tweak != nil {
			tweak(c)
		}
	})
	return l
}
