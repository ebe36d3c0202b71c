package agent

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

// TestBIGTCPPodStream: with BIG TCP on, the agent gives both ends of a pod's
// device GSO/GRO sizes of 192 KiB for both families, and a TCP stream
// between two pods of the agent crosses the BPF datapath in packets larger
// than 64 KiB: the sending endpoint's from-pod counters average more than
// 64 KiB per packet, over IPv4 and over IPv6, forwarded by the datapath
// (not handed to the host stack, which does not forward IPv6's jumbo
// packets: the stream stalled). With it off (the control, and what the test
// sees with the feature removed) no packet exceeds 64 KiB.
func TestBIGTCPPodStream(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("big-tcp=%v", on), func(t *testing.T) { bigTCPStream(t, on) })
	}
}

func bigTCPStream(t *testing.T, on bool) {
	fx := newFixture(t)
	pins := filepath.Join("/sys/fs/bpf", fmt.Sprintf("lk-t-agent-bigtcp-%d", os.Getpid()))
	t.Cleanup(func() { datapath.Unpin(pins) })
	var dp datapath.Datapath
	a, err := New(Config{
		StateDir: fx.stateDir, Socket: filepath.Join(fx.stateDir, "agent.sock"),
		PodCIDR: netip.MustParsePrefix("10.77.0.0/28"), PodCIDR6: netip.MustParsePrefix("fd00:77::/64"),
		MTU: 1500, HostNetns: fx.nodeNS.Path(), BPFDir: pins, BIGTCP: on,
		OpenDatapath: func(c datapath.Config, log *slog.Logger) (datapath.Datapath, error) {
			d, err := datapath.Open(c, log)
			dp = d
			return d, err
		},
	}, quietLog())
	if err != nil {
		t.Fatalf("start agent with the BPF datapath: %v", err)
	}
	t.Cleanup(func() { a.Close() })
	want := 0
	if on {
		want = netdev.BIGTCPSize
	}
	st, err := a.Status()
	if err != nil {
		t.Fatal(err)
	}
	if b := st.Routing.BIGTCP; b.Sizes.IPv4 != want || b.Sizes.IPv6 != want {
		t.Fatalf("status BIG TCP %+v, want %d for both families", b, want)
	}

	add := func(what string) (ns.NetNS, uint32, netip.Addr, netip.Addr) {
		n := netnstest.New(t, what)
		ep, err := a.Add(AddRequest{ContainerID: what, IfName: "eth0", Netns: n.Path()})
		if err != nil {
			t.Fatalf("add %s: %v", what, err)
		}
		return n, ep.ID, ep.IP, ep.IP6
	}
	cliNS, cliID, _, _ := add("btcli")
	srvNS, srvID, srvIP, srvIP6 := add("btsrv")

	// Both ends of the client's device.
	wantGSO := max(want, netdev.LegacyGSOMaxSize)
	checkGSO := func(where string, l netlink.Link) {
		la := l.Attrs()
		if int(la.GSOMaxSize) != wantGSO || int(la.GSOIPv4MaxSize) != wantGSO || int(la.GROMaxSize) != wantGSO || int(la.GROIPv4MaxSize) != wantGSO {
			t.Errorf("%s: gso %d gso_ipv4 %d gro %d gro_ipv4 %d, want %d", where, la.GSOMaxSize, la.GSOIPv4MaxSize, la.GROMaxSize, la.GROIPv4MaxSize, wantGSO)
		}
	}
	cliNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		checkGSO("pod end", l)
		return nil
	})
	fx.nodeNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(hostIfOf("btcli", "eth0"))
		if err != nil {
			t.Fatal(err)
		}
		checkGSO("host end", l)
		return nil
	})

	for _, dst := range []netip.Addr{srvIP, srvIP6} {
		network := "tcp4"
		if dst.Is6() {
			network = "tcp6"
		}
		var ln net.Listener
		if err := srvNS.Do(func(ns.NetNS) (err error) { ln, err = net.Listen(network, ":5201"); return err }); err != nil {
			t.Fatal(err)
		}
		got := make(chan int64, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				got <- 0
				return
			}
			c.SetDeadline(time.Now().Add(15 * time.Second))
			n, _ := io.Copy(io.Discard, c)
			c.Close()
			got <- n
		}()
		before, err := dp.Counters(cliID)
		if err != nil {
			t.Fatal(err)
		}
		// 128 MiB, at most 10 s.
		err = cliNS.Do(func(ns.NetNS) error {
			c, err := net.DialTimeout(network, netip.AddrPortFrom(dst, 5201).String(), 3*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			buf := make([]byte, 1<<20)
			for range 128 {
				if _, err := c.Write(buf); err != nil {
					return err
				}
			}
			return nil
		})
		n := <-got // all of it arrived: the counters are complete
		ln.Close()
		if err != nil || n != 128<<20 {
			c, _ := dp.Counters(cliID)
			sc, _ := dp.Counters(srvID)
			t.Fatalf("%s stream to %s: %d bytes arrived, %v (client's counters %+v, server's %+v)", network, dst, n, err, c, sc)
		}
		after, err := dp.Counters(cliID)
		if err != nil {
			t.Fatal(err)
		}
		pkts, bytes := after.FromPackets-before.FromPackets, after.FromBytes-before.FromBytes
		if pkts == 0 || bytes < 128<<20 {
			t.Fatalf("%s: from-pod counters +%d packets +%d bytes: the stream did not cross the datapath", network, pkts, bytes)
		}
		avg := bytes / pkts
		t.Logf("%s: %d packets, %d bytes through from_pod, %d bytes per packet", network, pkts, bytes, avg)
		if on && avg <= netdev.LegacyGSOMaxSize {
			t.Errorf("%s: %d bytes per packet through from_pod with BIG TCP on, want > 64 KiB", network, avg)
		}
		// The datapath forwards them itself (IPv6's carry the kernel's
		// jumbo hop-by-hop header, which the host stack would not forward).
		if stack := after.StackBytes - before.StackBytes; stack > bytes/100 {
			t.Errorf("%s: %d of %d bytes handed to the host stack, not forwarded by the datapath", network, stack, bytes)
		}
		if !on && avg > netdev.LegacyGSOMaxSize {
			t.Errorf("%s: %d bytes per packet with BIG TCP off: a packet above 64 KiB", network, avg)
		}
	}
}
