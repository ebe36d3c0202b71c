package agent

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

// pod adds pod ns/name with a Pod object carrying annotations.
func (l *uplinkLab) pod(t testing.TB, name string, annotations map[string]string) (ns.NetNS, uint32) {
	t.Helper()
	n := netnstest.New(t, name)
	ep, err := l.a.Add(AddRequest{ContainerID: name, IfName: "eth0", Netns: n.Path(),
		Labels: map[string]string{ArgPodNamespace: "bw", ArgPodName: name}})
	if err != nil {
		t.Fatalf("add %s: %v", name, err)
	}
	l.annotate(t, name, ep.IP, annotations)
	return n, ep.ID
}

func (l *uplinkLab) annotate(t testing.TB, name string, ip netip.Addr, annotations map[string]string) {
	t.Helper()
	var ann []string
	for k, v := range annotations {
		ann = append(ann, fmt.Sprintf("%q: %q", k, v))
	}
	y := fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata: {name: %s, namespace: bw, annotations: {%s}}\nspec: {containers: [{name: c, image: x}]}\nstatus: {phase: Running, podIP: %s, podIPs: [{ip: %s}]}\n",
		name, strings.Join(ann, ", "), ip, ip)
	if err := l.a.UpsertObjects(decodeObjs(t, y)); err != nil {
		t.Fatalf("pod object %s: %v", name, err)
	}
}

// rate sends from pod n to the remote host for d and returns the goodput
// the receiver saw after the first 500 ms (bits/s).
func (l *uplinkLab) rate(t *testing.T, n ns.NetNS, port int, d time.Duration) float64 {
	t.Helper()
	var ln net.Listener
	if err := l.remote.Do(func(ns.NetNS) (err error) {
		ln, err = net.Listen("tcp4", fmt.Sprintf("%s:%d", uplinkRemote, port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	res := make(chan float64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			res <- 0
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(d + 5*time.Second))
		buf := make([]byte, 256<<10)
		var start time.Time
		var n int64
		warm := time.Now().Add(500 * time.Millisecond)
		for {
			k, err := c.Read(buf)
			now := time.Now()
			if now.After(warm) {
				if start.IsZero() {
					start = now
				} else {
					n += int64(k)
				}
			}
			if err != nil {
				break
			}
		}
		if el := time.Since(start).Seconds(); !start.IsZero() && el > 0 {
			res <- float64(n) * 8 / el
			return
		}
		res <- 0
	}()
	if err := n.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp4", fmt.Sprintf("%s:%d", uplinkRemote, port), 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 64<<10)
		for end := time.Now().Add(d); time.Now().Before(end); {
			c.SetWriteDeadline(end)
			if _, err := c.Write(buf); err != nil {
				break // the deadline
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return <-res
}

// TestEgressBandwidthLimit: a pod's kubernetes.io/egress-bandwidth (on its
// Pod object, as the watcher hands it over) limits what it sends off the
// node to at most 10 % above the limit (and at least 90 % of it by EDT,
// 75 % by tbf) at 10, 100 and 1000 Mbit/s, following annotation
// changes, while a pod without the annotation sending at the same time is
// not held to it, and a lifted limit
// is removed. The limit is enforced by EDT in BPF with fq on the uplink
// where the kernel has fq, else (this machine: CONFIG_NET_SCH_FQ is not
// set) by tbf on the pod's device. An ingress-bandwidth annotation and a
// malformed value are reported, not enforced. Without the limit written
// (the setter a no-op), the pod sends at the unlimited rate and this fails.
func TestEgressBandwidthLimit(t *testing.T) {
	l := startUplinkLab(t, func(c *Config) { c.BandwidthManager = true })
	limNS, limID := l.pod(t, "bwlim", map[string]string{AnnotationEgressBandwidth: "10M"})
	freeNS, freeID := l.pod(t, "bwfree", nil)
	t.Logf("egress limits by %s: %s", l.a.bandwidth, l.a.bandwidthWhy)
	if got := l.enforced(t, limID, limNS); got != 10e6 {
		t.Fatalf("enforced limit %d, want 10M", got)
	}
	if got := l.enforced(t, freeID, freeNS); got != 0 {
		t.Fatalf("a pod without the annotation limited to %d", got)
	}
	// The limit counts frames (1,514 bytes per 1,448 of TCP payload: the
	// receiver can count at most 95.6 % of it). EDT paces without loss; tbf
	// drops at its queue's tail, and on a loaded machine (CI: other packages
	// run beside this one) a TCP sender's retransmission timeout (200 ms at
	// least) costs a 2-second window 10 % more. The upper bound is the
	// enforcement check in both modes; the lower one says the limit is not
	// harsher than asked.
	floor := 0.9
	if l.a.bandwidth == bandwidthTBF {
		floor = 0.75
	}
	for _, mbit := range []float64{10, 100, 1000} {
		if mbit != 10 {
			ep, _ := l.a.PolicyInfoOf(limID)
			l.annotate(t, "bwlim", l.ipOf(t, limID), map[string]string{AnnotationEgressBandwidth: fmt.Sprintf("%gM", mbit)})
			if got, _ := l.a.PolicyInfoOf(limID); got.EgressBPS != uint64(mbit*1e6) {
				t.Fatalf("after the annotation change: limit %d (was %d), want %g Mbit/s", got.EgressBPS, ep.EgressBPS, mbit)
			}
		}
		var limited, free float64
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); limited = l.rate(t, limNS, 5201, 2500*time.Millisecond) }()
		go func() { defer wg.Done(); free = l.rate(t, freeNS, 5202, 2500*time.Millisecond) }()
		wg.Wait()
		t.Logf("limit %g Mbit/s: the limited pod sent %.1f Mbit/s, the other pod %.1f Mbit/s at the same time", mbit, limited/1e6, free/1e6)
		if mbit == 1000 && free < 1.5*mbit*1e6 {
			t.Logf("skipping the check at 1000 Mbit/s: the unlimited pod reached only %.0f Mbit/s here", free/1e6)
			continue
		}
		switch {
		case limited > 1.1*mbit*1e6:
			t.Errorf("limit %g Mbit/s: the pod sent %.1f Mbit/s, want at most 10 %% above", mbit, limited/1e6)
		case mbit == 1000 && limited <= 110e6:
			// Two iperf3 pairs on a loaded 2-core machine may not reach
			// 1 Gbit/s each: here the check is that the raised limit
			// took (above the previous 100 Mbit/s), not the rate.
			t.Errorf("limit raised to 1000 Mbit/s: the pod still sent only %.1f Mbit/s", limited/1e6)
		case mbit != 1000 && limited < floor*mbit*1e6:
			t.Errorf("limit %g Mbit/s: the pod sent %.1f Mbit/s, want at least %.0f %% of it", mbit, limited/1e6, floor*100)
		}
		if free < 1.5*mbit*1e6 {
			t.Errorf("limit %g Mbit/s on another pod: the unlimited pod sent only %.1f Mbit/s", mbit, free/1e6)
		}
	}
	c, err := l.dp.Counters(limID)
	if err != nil || c.Drops[datapath.DropEDTHorizon] != 0 {
		t.Errorf("horizon drops of a TCP sender: %v %v, want none (fq back-pressure)", c.Drops, err)
	}

	// Lifted, then asked in ways lanekit does not enforce.
	l.annotate(t, "bwlim", l.ipOf(t, limID), nil)
	if got := l.enforced(t, limID, limNS); got != 0 {
		t.Errorf("limit lifted, still enforced at %d", got)
	}
	l.annotate(t, "bwfree", l.ipOf(t, freeID), map[string]string{AnnotationEgressBandwidth: "lots", AnnotationIngressBandwidth: "10M"})
	info, _ := l.a.PolicyInfoOf(freeID)
	if info.EgressBPS != 0 || !strings.Contains(info.BandwidthNote, "not a quantity") || !strings.Contains(info.BandwidthNote, "ingress-bandwidth \"10M\": not enforced") {
		t.Errorf("bad egress value and an ingress limit: %+v, want both reported and no limit", info)
	}
	if got := l.enforced(t, freeID, freeNS); got != 0 {
		t.Errorf("a malformed annotation limited the pod to %d", got)
	}
}

// enforced is endpoint id's egress limit where the agent's mode keeps it:
// the datapath's EDT map (and fq on the uplink) or the pod device's tbf.
func (l *uplinkLab) enforced(t *testing.T, id uint32, pod ns.NetNS) uint64 {
	t.Helper()
	switch l.a.bandwidth {
	case bandwidthEDT:
		rates, err := l.dp.EgressRates()
		if err != nil {
			t.Fatal(err)
		}
		if rates[id] > 0 {
			if err := l.node.Do(func(ns.NetNS) error {
				up, _ := netlink.LinkByName("bwup0")
				qs, err := netlink.QdiscList(up)
				if err != nil || len(qs) == 0 || qs[0].Type() != "fq" {
					return fmt.Errorf("uplink qdiscs %v %v, want fq", qs, err)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		return rates[id]
	case bandwidthTBF:
		bps, err := netdev.PodEgressTBF(pod.Path(), "eth0")
		if err != nil {
			t.Fatal(err)
		}
		return bps
	}
	t.Fatalf("bandwidth manager %q", l.a.bandwidth)
	return 0
}

func (l *uplinkLab) ipOf(t *testing.T, id uint32) netip.Addr { return l.ep(t, id).IP }
