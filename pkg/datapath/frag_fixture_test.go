package datapath

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/policy"
)

// IPv4 fragment fixtures (bpf/lib/frag.h): the first fragment's ports carry
// later fragments through conntrack, DNAT / rev-NAT and policy.

// fragments splits an Ethernet + IPv4 frame (valid checksums) into a first
// fragment carrying the first `first` bytes of the IP payload (a multiple
// of 8) and a later fragment carrying the rest, both with IP ID id.
func fragments(frame []byte, id uint16, first int) (head, tail []byte) {
	payload := frame[34:]
	mk := func(data []byte, off int, mf bool) []byte {
		b := append(bytes.Clone(frame[:34]), data...)
		ip := b[14:34]
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(data)))
		binary.BigEndian.PutUint16(ip[4:], id)
		fo := uint16(off / 8)
		if mf {
			fo |= 0x2000
		}
		binary.BigEndian.PutUint16(ip[6:], fo)
		ip[10], ip[11] = 0, 0
		binary.BigEndian.PutUint16(ip[10:], testutil.IPv4Checksum(ip))
		return b
	}
	return mk(payload[:first], 0, true), mk(payload[first:], first, false)
}

// reassemble joins a first and a later fragment as the receiver would.
func reassemble(t *testing.T, head, tail []byte) []byte {
	t.Helper()
	hl := int(binary.BigEndian.Uint16(head[16:])) - 20
	tl := int(binary.BigEndian.Uint16(tail[16:])) - 20
	if !bytes.Equal(head[26:34], tail[26:34]) || !bytes.Equal(head[18:20], tail[18:20]) {
		t.Fatalf("fragments differ in addresses or ID: %x / %x", head[14:34], tail[14:34])
	}
	b := append(bytes.Clone(head[:34+hl]), tail[34:34+tl]...)
	ip := b[14:34]
	binary.BigEndian.PutUint16(ip[2:], uint16(20+hl+tl))
	binary.BigEndian.PutUint16(ip[6:], 0)
	ip[10], ip[11] = 0, 0
	binary.BigEndian.PutUint16(ip[10:], testutil.IPv4Checksum(ip))
	if !testutil.L4ChecksumValid(b) {
		t.Fatalf("reassembled datagram's L4 checksum invalid: %x", b)
	}
	return b
}

func TestFragmentFixtures(t *testing.T) {
	s := newSvcEnv(t)
	e := s.fixtureEnv
	pod := fromPod(e)
	up := fromUplink(e)
	big := bytes.Repeat([]byte("0123456789abcdef"), 12) // 192 bytes of payload: 200 of UDP

	t.Run("fragmented UDP through a ClusterIP: DNAT and rev-NAT of every fragment", func(t *testing.T) {
		s.enter(t)
		s.apply(t, svcYAML("frag", "10.96.0.30", 53, "UDP", "", "10.244.1.11"))
		req := l4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", 41500, "10.96.0.30", 53, ipProtoUDP, 0, 0, 0, big)
		head, tail := fragments(req, 0x1234, 96)
		r1 := s.run(t, pod, ifH1(e), head)
		if got := parseTuple(t, r1.out); r1.verdict != tcActRedirect || r1.redirIf != ifH2(e) || got.dst != ap("10.244.1.11:8080") {
			t.Fatalf("first fragment: verdict %d to %d, dst %s; want redirect to 10.244.1.11:8080", r1.verdict, r1.redirIf, got.dst)
		}
		r2 := s.run(t, pod, ifH1(e), tail)
		if r2.verdict != tcActRedirect || r2.redirIf != ifH2(e) {
			t.Fatalf("later fragment: verdict %d to %d, want redirect into the backend", r2.verdict, r2.redirIf)
		}
		d := reassemble(t, r1.out, r2.out)
		if got := parseTuple(t, d); got.dst != ap("10.244.1.11:8080") || got.src != ap("10.244.1.10:41500") {
			t.Fatalf("reassembled request %s -> %s, want 10.244.1.10:41500 -> 10.244.1.11:8080", got.src, got.dst)
		}
		if !bytes.Equal(d[42:], big) {
			t.Fatal("request payload changed")
		}
		// The backend's fragmented reply goes back from the service address.
		before := s.stats(t)
		rep := l4Frame(e.ep2.HostMAC, pod2MAC, "10.244.1.11", 8080, "10.244.1.10", 41500, ipProtoUDP, 0, 0, 0, big)
		head, tail = fragments(rep, 0x4321, 104)
		r1 = s.run(t, pod, ifH2(e), head)
		r2 = s.run(t, pod, ifH2(e), tail)
		if r1.verdict != tcActRedirect || r1.redirIf != ifH1(e) || r2.verdict != tcActRedirect || r2.redirIf != ifH1(e) {
			t.Fatalf("reply fragments: verdicts %d/%d to %d/%d, want both into the client", r1.verdict, r2.verdict, r1.redirIf, r2.redirIf)
		}
		if src := netip.AddrFrom4([4]byte(r2.out[26:30])); src.String() != "10.96.0.30" {
			t.Fatalf("later reply fragment leaves from %s, want the service address", src)
		}
		if got := parseTuple(t, reassemble(t, r1.out, r2.out)); got.src != ap("10.96.0.30:53") || got.dst != ap("10.244.1.10:41500") {
			t.Fatalf("reassembled reply %s -> %s, want 10.96.0.30:53 -> 10.244.1.10:41500", got.src, got.dst)
		}
		if n := s.stats(t).RevNAT - before.RevNAT; n != 2 {
			t.Fatalf("rev-NAT counted %d times, want 2 (both fragments)", n)
		}
	})

	t.Run("remote backend: fragments leave DNATed, the fragmented reply is rev-NATed on the uplink", func(t *testing.T) {
		s.enter(t)
		s.apply(t, svcYAML("frag-remote", "10.96.0.31", 53, "UDP", "", "10.244.2.5"))
		req := l4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", 41600, "10.96.0.31", 53, ipProtoUDP, 0, 0, 0, big)
		head, tail := fragments(req, 0x2345, 64)
		r1 := s.run(t, pod, ifH1(e), head)
		r2 := s.run(t, pod, ifH1(e), tail)
		if r1.verdict != tcActRedirect || r2.verdict != tcActRedirect || r1.redirIf != ifUp(e) || r2.redirIf != ifUp(e) {
			t.Fatalf("request fragments: verdicts %d/%d to %d/%d, want both out of the uplink", r1.verdict, r2.verdict, r1.redirIf, r2.redirIf)
		}
		if got := parseTuple(t, reassemble(t, r1.out, r2.out)); got.dst != ap("10.244.2.5:8080") {
			t.Fatalf("reassembled request to %s, want 10.244.2.5:8080", got.dst)
		}
		rep := l4Frame(e.up.Attrs().HardwareAddr, neighMAC, "10.244.2.5", 8080, "10.244.1.10", 41600, ipProtoUDP, 0, 0, 0, big)
		head, tail = fragments(rep, 0x5432, 136)
		r1 = s.run(t, up, ifUp(e), head)
		r2 = s.run(t, up, ifUp(e), tail)
		if r1.verdict != tcActRedirect || r2.verdict != tcActRedirect || r1.redirIf != ifH1(e) || r2.redirIf != ifH1(e) {
			t.Fatalf("reply fragments: verdicts %d/%d to %d/%d, want both into the client", r1.verdict, r2.verdict, r1.redirIf, r2.redirIf)
		}
		if got := parseTuple(t, reassemble(t, r1.out, r2.out)); got.src != ap("10.96.0.31:53") || got.dst != ap("10.244.1.10:41600") {
			t.Fatalf("reassembled reply %s -> %s, want 10.96.0.31:53 -> 10.244.1.10:41600", got.src, got.dst)
		}
	})

	t.Run("later fragment without its first: dropped, counted frag-not-found", func(t *testing.T) {
		s.enter(t)
		req := l4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", 41501, "10.96.0.30", 53, ipProtoUDP, 0, 0, 0, big)
		_, tail := fragments(req, 0x5555, 96)
		before, err := e.dp.Counters(e.ep1.ID)
		if err != nil {
			t.Fatal(err)
		}
		if r := s.run(t, pod, ifH1(e), tail); r.verdict != tcActShot {
			t.Fatalf("orphan later fragment from a pod: verdict %d, want drop", r.verdict)
		}
		after, err := e.dp.Counters(e.ep1.ID)
		if err != nil {
			t.Fatal(err)
		}
		if d := after.Drops[DropFragNotFound] - before.Drops[DropFragNotFound]; d != 1 {
			t.Fatalf("frag-not-found drops grew by %d, want 1", d)
		}
		// Out of order on the uplink: the later fragment first is dropped.
		in := l4Frame(e.up.Attrs().HardwareAddr, neighMAC, "10.244.2.5", 9000, "10.244.1.10", 41502, ipProtoUDP, 0, 0, 0, big)
		_, tail = fragments(in, 0x6666, 96)
		if r := s.run(t, up, ifUp(e), tail); r.verdict != tcActShot {
			t.Fatalf("later fragment before its first on the uplink: verdict %d, want drop", r.verdict)
		}
	})
}

// TestFragmentPolicy: a port rule judges later fragments on the port their
// first fragment carried: allowed with it, denied with it.
func TestFragmentPolicy(t *testing.T) {
	s := newSvcEnv(t)
	e := s.fixtureEnv
	in := policyWorld(e)
	in.Policies = decodePolicies(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-udp-53, namespace: alpha}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - ports: [{port: 53, protocol: UDP}]
`)
	c, err := policy.Compile(in, policy.NewIdentities())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.dp.ApplyPolicy(policy.Diff(nil, c)); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("fragment"), 24)
	for _, tc := range []struct {
		name  string
		dport uint16
		id    uint16
		want  uint32
		evict bool // the flow's conntrack entry is gone before the later fragment
	}{
		{"allowed port: both fragments pass", 53, 0x0a01, tcActRedirect, false},
		{"denied port: both fragments dropped", 54, 0x0a02, tcActShot, false},
		// Judged again, on its first fragment's port (not as port-less).
		{"allowed port, flow entry evicted in between: the later fragment passes", 53, 0x0a03, tcActRedirect, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := l4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", 42500, "10.244.1.11", tc.dport, ipProtoUDP, 0, 0, 0, big)
			head, tail := fragments(req, tc.id, 96)
			r1 := s.run(t, fromPod(e), ifH1(e), head)
			if tc.evict {
				var k podCtKey
				var keys []podCtKey
				it := e.dp.pod.LkCt4.Iterate()
				for it.Next(&k, new(podCtEntry)) {
					keys = append(keys, k)
				}
				for _, k := range keys {
					_ = e.dp.pod.LkCt4.Delete(k)
				}
			}
			r2 := s.run(t, fromPod(e), ifH1(e), tail)
			if r1.verdict != tc.want || r2.verdict != tc.want {
				t.Fatalf("port %d: first fragment verdict %d, later %d; want %d for both", tc.dport, r1.verdict, r2.verdict, tc.want)
			}
		})
	}
}
