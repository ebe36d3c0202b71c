package datapath

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/lanekit/lanekit/internal/testutil"
)

// TestIPv6OnlyEndpoint: an endpoint of an IPv6-only node (no IPv4 address)
// is written without an IPv4 entry (its old one, from when it had IPv4, is
// removed), by ifindex with address 0.0.0.0 (IPv4 it sends is spoofed) and
// its IPv6 address, and found by PinnedCounters through that address; an
// endpoint with no address at all is refused.
func TestIPv6OnlyEndpoint(t *testing.T) {
	e := newFixtureEnv6(t)
	ep := e.ep1
	ep.IP = netip.Addr{}
	if err := e.dp.UpsertEndpoint(ep); err != nil {
		t.Fatalf("upsert an IPv6-only endpoint: %v", err)
	}
	var info podEndpointInfo
	if err := e.dp.pod.LkEndpoints.Lookup(ipKey(e.ep1.IP.As4()), &info); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("the endpoint's old IPv4 entry: %v %+v, want none", err, info)
	}
	if err := e.dp.pod.LkEpByIfindex.Lookup(uint32(ep.IfIndex), &info); err != nil || info.Ip != 0 || info.Ip6 != ep.IP6.As16() {
		t.Fatalf("by ifindex: %+v %v, want IPv4 0 and %v", info, err, ep.IP6)
	}
	if err := e.dp.pod.LkEndpoints6.Lookup(ep.IP6.As16(), &info); err != nil || info.Id != ep.ID {
		t.Fatalf("by IPv6 address: %+v %v", info, err)
	}
	if id, _, err := PinnedCounters(e.pinDir, ep.IP6); err != nil || id != ep.ID {
		t.Fatalf("PinnedCounters by %v: id %d %v, want %d", ep.IP6, id, err, ep.ID)
	}
	// Any IPv4 it sends is spoofed: from its old address, and from 0.0.0.0,
	// which equals the 0 it is written with.
	e.enter(t)
	for _, src := range []string{e.ep1.IP.String(), "0.0.0.0"} {
		before, err := e.dp.Counters(ep.ID)
		if err != nil {
			t.Fatal(err)
		}
		v := runPod(t, e, ep.IfIndex, testutil.IPv4Frame(ep.HostMAC, ep.MAC, src, "10.244.2.5", 64))
		after, err := e.dp.Counters(ep.ID)
		if err != nil {
			t.Fatal(err)
		}
		if d := after.Drops[DropSpoofedIP] - before.Drops[DropSpoofedIP]; v != tcActShot || d != 1 {
			t.Errorf("IPv4 from %s: verdict %d, spoofed-ip drops +%d; want a drop", src, v, d)
		}
	}
	ep.IP6 = netip.Addr{}
	if err := e.dp.UpsertEndpoint(ep); err == nil {
		t.Fatal("an endpoint without any address was accepted")
	}
}
