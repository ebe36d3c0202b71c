package lbipam

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/internal/testutil"
)

// underlay is a client namespace with a bridge (the wire) and two node
// namespaces, each with an uplink on the bridge.
type underlay struct {
	client, nodes [2]string // netns paths (client[1] unused)
	macs          [2]net.HardwareAddr
}

// newUnderlay builds the namespaces; t.Cleanup deletes them.
func newUnderlay(t *testing.T, tag string) *underlay {
	t.Helper()
	testutil.RequireRoot(t)
	u := &underlay{}
	mk := func(name string) string {
		orig, err := netns.Get()
		if err != nil {
			t.Fatal(err)
		}
		defer orig.Close()
		done := make(chan error)
		go func() {
			// NewNamed unshares the calling thread's netns and bind-mounts
			// /proc/self/task/TID/ns/net: unlocked, the goroutine could move
			// to another thread in between and name that one's namespace —
			// the machine's (the client's "private" bridge then went up in
			// the root netns, and its neighbour check read the machine's
			// gateway). Locked and never unlocked: the thread dies with the
			// goroutine.
			runtime.LockOSThread()
			h, err := netns.NewNamed(name)
			if err == nil {
				h.Close()
			}
			done <- err
		}()
		if err := <-done; err != nil {
			t.Fatalf("netns %s: %v", name, err)
		}
		t.Cleanup(func() { _ = netns.DeleteNamed(name) })
		p := filepath.Join("/run/netns", name)
		if err := testutil.InNetnsPath(p, func() error {
			for _, k := range []string{"all", "default"} {
				_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+k+"/accept_dad", []byte("0"), 0o644)
			}
			lo, err := netlink.LinkByName("lo")
			if err != nil {
				return err
			}
			return netlink.LinkSetUp(lo)
		}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pid := os.Getpid()
	u.client[0] = mk(fmt.Sprintf("lkt-l2c-%s-%d", tag, pid))
	for i := range u.nodes {
		u.nodes[i] = mk(fmt.Sprintf("lkt-l2n%d-%s-%d", i, tag, pid))
	}
	nodeNS := [2]netns.NsHandle{}
	for i, p := range u.nodes {
		h, err := netns.GetFromPath(p)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		nodeNS[i] = h
	}
	if err := testutil.InNetnsPath(u.client[0], func() error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("bridge: %w", err)
		}
		for _, s := range []string{"192.0.2.100/24", "2001:db8::100/64"} {
			a, _ := netlink.ParseAddr(s)
			a.Flags = unix.IFA_F_NODAD
			if err := netlink.AddrAdd(br, a); err != nil {
				return err
			}
		}
		if err := netlink.LinkSetUp(br); err != nil {
			return err
		}
		for i := range u.nodes {
			v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("c%d", i), MasterIndex: br.Index},
				PeerName: "uplink", PeerNamespace: netlink.NsFd(nodeNS[i])}
			if err := netlink.LinkAdd(v); err != nil {
				return fmt.Errorf("veth: %w", err)
			}
			if err := netlink.LinkSetUp(v); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for i, p := range u.nodes {
		if err := testutil.InNetnsPath(p, func() error {
			l, err := netlink.LinkByName("uplink")
			if err != nil {
				return err
			}
			u.macs[i] = l.Attrs().HardwareAddr
			a, _ := netlink.ParseAddr(fmt.Sprintf("192.0.2.%d/24", 201+i))
			if err := netlink.AddrAdd(l, a); err != nil {
				return err
			}
			return netlink.LinkSetUp(l)
		}); err != nil {
			t.Fatal(err)
		}
	}
	return u
}

// neighbour is the client's neighbour entry for ip on the wire: its MAC,
// or nil while unresolved. probe first sends a datagram to ip, so the
// client's kernel solicits it (ARP or NDP) if it has no entry.
func (u *underlay) neighbour(t *testing.T, ip netip.Addr, probe bool) net.HardwareAddr {
	t.Helper()
	var mac net.HardwareAddr
	if err := testutil.InNetnsPath(u.client[0], func() error {
		if probe {
			if c, err := net.Dial("udp", net.JoinHostPort(ip.String(), "9")); err == nil {
				_, _ = c.Write([]byte("x"))
				c.Close()
			}
		}
		fam := netlink.FAMILY_V4
		if ip.Is6() {
			fam = netlink.FAMILY_V6
		}
		ns, err := netlink.NeighList(0, fam)
		if err != nil {
			return err
		}
		for _, n := range ns {
			if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == ip && n.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_DELAY|netlink.NUD_PROBE|netlink.NUD_PERMANENT) != 0 {
				mac = n.HardwareAddr
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return mac
}

// flush forgets the client's neighbour entry for ip.
func (u *underlay) flush(t *testing.T, ip netip.Addr) {
	t.Helper()
	_ = testutil.InNetnsPath(u.client[0], func() error {
		br, err := netlink.LinkByName("br0")
		if err != nil {
			return err
		}
		fam := netlink.FAMILY_V4
		if ip.Is6() {
			fam = netlink.FAMILY_V6
		}
		return netlink.NeighDel(&netlink.Neigh{LinkIndex: br.Attrs().Index, Family: fam, IP: ip.AsSlice()})
	})
}

// waitNeighbour polls until the client's entry for ip is mac (nil: stays
// unresolved for the whole wait), within limit.
func (u *underlay) waitNeighbour(t *testing.T, ip netip.Addr, mac net.HardwareAddr, probe bool, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var got net.HardwareAddr
	for time.Since(start) < limit {
		got = u.neighbour(t, ip, probe)
		if mac != nil && got.String() == mac.String() {
			return time.Since(start)
		}
		if mac == nil && got != nil {
			t.Fatalf("%s resolved to %s, want no answer", ip, got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if mac != nil {
		t.Fatalf("%s: client's neighbour entry is %v after %v, want %s", ip, got, limit, mac)
	}
	return limit
}

// The client's own kernel resolves a pool address to the announcing
// node's MAC (ARP for IPv4, NDP for IPv6), a takeover reaches the client
// unasked (gratuitous ARP / unsolicited NA overriding its entry), and a
// node that stopped announcing no longer answers.
func TestResponderTakeover(t *testing.T) {
	u := newUnderlay(t, "r")
	var rs [2]*Responder
	for i, p := range u.nodes {
		r, err := OpenResponder(p, "uplink", nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		rs[i] = r
	}
	for _, ip := range []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")} {
		t.Run(ip.String(), func(t *testing.T) {
			if err := rs[0].Set([]netip.Addr{ip}); err != nil {
				t.Fatal(err)
			}
			u.flush(t, ip)
			u.waitNeighbour(t, ip, u.macs[0], true, 3*time.Second)
			time.Sleep(1100 * time.Millisecond) // past the neighbour entry's locktime
			// Takeover: node 1 stops, node 2 starts; the client learns it
			// without asking (no probe).
			if err := rs[0].Set(nil); err != nil {
				t.Fatal(err)
			}
			if err := rs[1].Set([]netip.Addr{ip}); err != nil {
				t.Fatal(err)
			}
			took := u.waitNeighbour(t, ip, u.macs[1], false, 3*time.Second)
			t.Logf("%s: client moved to node 2's MAC %v after the takeover", ip, took)
			// Nobody announces: a fresh query goes unanswered.
			if err := rs[1].Set(nil); err != nil {
				t.Fatal(err)
			}
			u.flush(t, ip)
			u.waitNeighbour(t, ip, nil, true, 1500*time.Millisecond)
		})
	}
}
