package agent

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/netdev"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

// TestNodeAddrsBothFamilies: without --node-addr, NodePort frontends listen
// on the uplink's global addresses of both families (IPv6 NodePorts), not
// on its link-local ones.
func TestNodeAddrsBothFamilies(t *testing.T) {
	testutil.RequireRoot(t)
	n := netnstest.New(t, "nodeaddrs")
	h, err := netdev.NewHost(n.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	err = h.Do(func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lk-na-up"}, PeerName: "lk-na-peer"}); err != nil {
			return err
		}
		link, err := netlink.LinkByName("lk-na-up")
		if err != nil {
			return err
		}
		for _, s := range []string{"10.77.0.1/24", "fd00:77::1/64", "fe80::77/64"} {
			a, _ := netlink.ParseAddr(s)
			a.Flags = 0x02 // IFA_F_NODAD
			if err := netlink.AddrAdd(link, a); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{cfg: Config{Uplink: "lk-na-up"}, host: h}
	got, err := a.nodeAddrs()
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Addr{netip.MustParseAddr("10.77.0.1"), netip.MustParseAddr("fd00:77::1")}
	if !slices.Equal(got, want) {
		t.Errorf("node addresses %v, want %v", got, want)
	}
}
