package datapath

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// TestPolicyPacketCost (opt-in: LANEKIT_POLICY_COST=1) measures what an
// established connection's packets cost from_uplink into an endpoint that 0,
// 1 or 1,000 NetworkPolicies select (the lab bench's set: one allowing the
// client, the rest decoy ipBlocks), with BPF_PROG_TEST_RUN's repeat, and
// logs ns per packet. A measurement, not a check.
func TestPolicyPacketCost(t *testing.T) {
	if os.Getenv("LANEKIT_POLICY_COST") == "" {
		t.Skip("a measurement: LANEKIT_POLICY_COST=1 runs it")
	}
	for _, n := range []int{0, 1, 1000} {
		t.Run(fmt.Sprintf("%d policies", n), func(t *testing.T) {
			e := newFixtureEnv(t)
			var y strings.Builder
			for i := range n {
				fmt.Fprintf(&y, "---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p%d, namespace: alpha}\nspec:\n  podSelector: {}\n  ingress:\n", i)
				if i == 0 {
					y.WriteString("  - from: [{podSelector: {matchLabels: {app: client}}}]\n")
				} else {
					fmt.Fprintf(&y, "  - from: [{ipBlock: {cidr: 10.200.%d.%d/32}}]\n    ports: [{port: %d}]\n", i/250, 1+i%250, 1000+i)
				}
			}
			if n > 0 {
				applyWorldPolicies(t, e, y.String())
			}
			// The connection's first packet (SYN) opens it; then its ACKs.
			syn := polFrameFlags(e.up.Attrs().HardwareAddr, neighMAC, "10.244.2.7", "10.244.1.11", ipProtoTCP, 41000, 8080, tcpSYN)
			ack := polFrameFlags(e.up.Attrs().HardwareAddr, neighMAC, "10.244.2.7", "10.244.1.11", ipProtoTCP, 41000, 8080, tcpACK)
			run := func(in []byte, repeat uint32) (uint32, time.Duration) {
				out := make([]byte, len(in)+256)
				opts := &ebpf.RunOptions{Data: bytes.Clone(in), DataOut: out, Context: skbCtx{Ifindex: uint32(ifUp(e))}, Repeat: repeat}
				start := time.Now()
				ret, err := fromUplink(e).Run(opts)
				if err != nil {
					t.Fatal(err)
				}
				return ret, time.Since(start) / time.Duration(repeat)
			}
			if ret, _ := run(syn, 1); ret != tcActRedirect {
				t.Fatalf("SYN: verdict %d", ret)
			}
			if ret, _ := run(ack, 1); ret != tcActRedirect {
				t.Fatalf("ACK once: verdict %d", ret)
			}
			// One run a syscall: a repeated test run reuses the skb, whose
			// MACs the first run rewrote (the rest would take another path).
			best := time.Hour
			for range 5 {
				start := time.Now()
				for range 20000 {
					if ret, _ := run(ack, 1); ret != tcActRedirect {
						t.Fatalf("ACK: verdict %d", ret)
					}
				}
				best = min(best, time.Since(start)/20000)
			}
			// New connections: a SYN of its own 5-tuple each (a rule lookup and
			// a conntrack insert).
			bestNew := time.Hour
			for r := range 5 {
				start := time.Now()
				for i := range 10000 {
					s := polFrameFlags(e.up.Attrs().HardwareAddr, neighMAC, "10.244.2.7", "10.244.1.11", ipProtoTCP, uint16(1024+r*10000+i), 8080, tcpSYN)
					if ret, _ := run(s, 1); ret != tcActRedirect {
						t.Fatalf("SYN %d: verdict %d", i, ret)
					}
				}
				bestNew = min(bestNew, time.Since(start)/10000)
			}
			t.Logf("%d policies: %v per new connection's SYN", n, bestNew)
			t.Logf("%d policies: %v per established packet (from_uplink, one BPF_PROG_TEST_RUN each, syscall included; best of 5 x 20,000)", n, best)
		})
	}
}
