package agent

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/netdev"
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

// ep returns stored endpoint id.
func (l *uplinkLab) ep(tb testing.TB, id uint32) endpoint.Endpoint {
	tb.Helper()
	eps, err := l.a.endpoints()
	if err != nil {
		tb.Fatal(err)
	}
	for _, ep := range eps {
		if ep.ID == id {
			return ep
		}
	}
	tb.Fatalf("no endpoint %d", id)
	return endpoint.Endpoint{}
}

// stream sends total bytes from namespace from to dst:5201, a listener in
// namespace to, over streams parallel TCP connections (at most 15 s), and
// returns what arrived.
func stream(from, to ns.NetNS, dst netip.Addr, streams int, total int64) (int64, error) {
	network := "tcp4"
	if dst.Is6() {
		network = "tcp6"
	}
	var ln net.Listener
	if err := to.Do(func(ns.NetNS) (err error) { ln, err = net.Listen(network, ":5201"); return err }); err != nil {
		return 0, err
	}
	defer ln.Close()
	deadline := time.Now().Add(15 * time.Second)
	got := make(chan int64, streams)
	go func() {
		for range streams {
			c, err := ln.Accept()
			if err != nil {
				got <- 0
				continue
			}
			go func() {
				c.SetDeadline(deadline)
				n, _ := io.Copy(io.Discard, c)
				c.Close()
				got <- n
			}()
		}
	}()
	errs := make(chan error, streams)
	for range streams {
		go func() {
			errs <- from.Do(func(ns.NetNS) error {
				c, err := net.DialTimeout(network, netip.AddrPortFrom(dst, 5201).String(), 3*time.Second)
				if err != nil {
					return err
				}
				defer c.Close()
				c.SetDeadline(deadline)
				buf := make([]byte, 1<<20)
				for left := total / int64(streams); left > 0; left -= int64(len(buf)) {
					if _, err := c.Write(buf[:min(left, int64(len(buf)))]); err != nil {
						return err
					}
				}
				return nil
			})
		}()
	}
	var n int64
	var err error
	for range streams {
		err = errors.Join(err, <-errs)
		n += <-got // all of it arrived: the counters are complete
	}
	return n, err
}

func bigTCPStream(t *testing.T, on bool) {
	l := startUplinkLab(t, func(c *Config) { c.BIGTCP = on })
	st, err := l.a.Status()
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	if on {
		want = netdev.BIGTCPSize
	}
	if b := st.Routing.BIGTCP; b.Sizes.IPv4 != want || b.Sizes.IPv6 != want {
		t.Fatalf("status BIG TCP %+v, want %d for both families", b, want)
	}
	cli, cliID := l.pod(t, "btcli", nil)
	srv, srvID := l.pod(t, "btsrv", nil)
	srvEP := l.ep(t, srvID)

	// Both ends of the client's device, and the uplink.
	wantGSO := max(want, netdev.LegacyGSOMaxSize)
	checkGSO := func(where string, n ns.NetNS, dev string) {
		n.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName(dev)
			if err != nil {
				t.Fatal(err)
			}
			la := l.Attrs()
			if int(la.GSOMaxSize) != wantGSO || int(la.GSOIPv4MaxSize) != wantGSO || int(la.GROMaxSize) != wantGSO || int(la.GROIPv4MaxSize) != wantGSO {
				t.Errorf("%s: gso %d gso_ipv4 %d gro %d gro_ipv4 %d, want %d", where, la.GSOMaxSize, la.GSOIPv4MaxSize, la.GROMaxSize, la.GROIPv4MaxSize, wantGSO)
			}
			return nil
		})
	}
	checkGSO("pod end", cli, "eth0")
	checkGSO("host end", l.node, hostIfOf("btcli", "eth0"))
	checkGSO("uplink", l.node, "bwup0")

	const total = 128 << 20
	for _, to := range []struct {
		what string
		ns   ns.NetNS
		dst  netip.Addr
	}{
		{"pod on the node", srv, srvEP.IP}, {"pod on the node", srv, srvEP.IP6},
		{"host behind the uplink", l.remote, netip.MustParseAddr(uplinkRemote)},
		{"host behind the uplink", l.remote, netip.MustParseAddr(uplinkRemote6)},
	} {
		before, err := l.dp.Counters(cliID)
		if err != nil {
			t.Fatal(err)
		}
		n, err := stream(cli, to.ns, to.dst, 1, total)
		if err != nil || n != total {
			c, _ := l.dp.Counters(cliID)
			t.Fatalf("stream to the %s %s: %d bytes arrived, %v (client's counters %+v)", to.what, to.dst, n, err, c)
		}
		after, err := l.dp.Counters(cliID)
		if err != nil {
			t.Fatal(err)
		}
		pkts, bytes := after.FromPackets-before.FromPackets, after.FromBytes-before.FromBytes
		if pkts == 0 || bytes < total {
			t.Fatalf("to the %s %s: from-pod counters +%d packets +%d bytes: the stream did not cross the datapath", to.what, to.dst, pkts, bytes)
		}
		avg := bytes / pkts
		t.Logf("to the %s %s: %d packets, %d bytes through from_pod, %d bytes per packet", to.what, to.dst, pkts, bytes, avg)
		if on && avg <= netdev.LegacyGSOMaxSize {
			t.Errorf("to the %s %s: %d bytes per packet through from_pod with BIG TCP on, want > 64 KiB", to.what, to.dst, avg)
		}
		// The datapath forwards them itself (IPv6's carry the kernel's
		// jumbo hop-by-hop header, which the host stack would not forward).
		if stack := after.StackBytes - before.StackBytes; stack > bytes/100 {
			t.Errorf("to the %s %s: %d of %d bytes handed to the host stack, not forwarded by the datapath", to.what, to.dst, stack, bytes)
		}
		if !on && avg > netdev.LegacyGSOMaxSize {
			t.Errorf("to the %s %s: %d bytes per packet with BIG TCP off: a packet above 64 KiB", to.what, to.dst, avg)
		}
	}
}

// BenchmarkBIGTCPPodStream: pod -> pod on one node and pod -> a host behind
// the uplink, through the BPF datapath, BIG TCP on and off, each family, 1
// and 8 streams (root; not run by make test:
// go test ./pkg/agent -run '^$' -bench BIGTCP -benchtime 3x).
func BenchmarkBIGTCPPodStream(b *testing.B) {
	const total = 256 << 20
	for _, on := range []bool{true, false} {
		b.Run(fmt.Sprintf("big-tcp=%v", on), func(b *testing.B) {
			l := startUplinkLab(b, func(c *Config) { c.BIGTCP = on }) // closed when this sub-benchmark ends
			cli, _ := l.pod(b, "btcli", nil)
			srv, srvID := l.pod(b, "btsrv", nil)
			srvEP := l.ep(b, srvID)
			for _, to := range []struct {
				what string
				ns   ns.NetNS
				dst  netip.Addr
			}{
				{"pod", srv, srvEP.IP}, {"pod", srv, srvEP.IP6},
				{"remote", l.remote, netip.MustParseAddr(uplinkRemote)}, {"remote", l.remote, netip.MustParseAddr(uplinkRemote6)},
			} {
				for _, streams := range []int{1, 8} {
					b.Run(fmt.Sprintf("%s-%s/streams=%d", to.what, map[bool]string{true: "ipv4", false: "ipv6"}[to.dst.Is4()], streams), func(b *testing.B) {
						b.SetBytes(total)
						for range b.N {
							if n, err := stream(cli, to.ns, to.dst, streams, total); err != nil || n != total {
								b.Fatalf("%d bytes arrived: %v", n, err)
							}
						}
						b.ReportMetric(float64(total)*8*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gbit/s")
					})
				}
			}
		})
	}
}
