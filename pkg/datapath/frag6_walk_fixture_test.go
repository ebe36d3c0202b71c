package datapath

import (
	"encoding/binary"
	"testing"
)

// fragHdr6 is an IPv6 fragment header (offset in 8-byte units, more
// fragments, identification id) in front of rest.
func fragHdr6(next byte, offset uint16, more bool, id uint32, rest []byte) []byte {
	h := []byte{next, 0, 0, 0, 0, 0, 0, 0}
	v := offset << 3
	if more {
		v |= 1
	}
	binary.BigEndian.PutUint16(h[2:], v)
	binary.BigEndian.PutUint32(h[4:], id)
	return append(h, rest...)
}

// TestIPv6LaterFragmentWalk: the extension-header walk stops at a later
// fragment's fragment header, because what follows it is payload. Pod 1
// (client) may reach pod 2 (web) on TCP 8000-8080 only. Datagram X's first
// fragment (TCP 8080) passes and its ports are remembered; datagram Y's
// (TCP 22) is dropped. A later fragment of Y whose payload reads as more
// headers (a destination-options header, or a second fragment header right
// away) naming X's identification and then a TCP header to 8080 must not
// be taken for part of X (allowed); it is judged as what it is: a fragment
// of Y with no port, denied. X's own later fragment still passes (the port
// of its first fragment).
func TestIPv6LaterFragmentWalk(t *testing.T) {
	s := newSvcEnv6(t)
	e := s.fixtureEnv
	e.enter(t)
	applyClientEgress6(t, e)
	const idX, idY = 0x5a5a0001, 0x5a5a0002
	toWeb := func(fragment []byte) []byte {
		return eth6(e.ep1.HostMAC, pod1MAC, pod1IP6, pod2IP6, nhFrag, 64, fragment)
	}
	tcp := func(dport uint16) []byte {
		return polFrame6(nil, nil, pod1IP6, pod2IP6, ipProtoTCP, 45100, dport, tcpACK)[54:]
	}
	// Payload bytes shaped as headers: a fragment header with X's
	// identification and offset 0, then a TCP header to 8080.
	fakeFirstOfX := fragHdr6(nhTCP, 0, true, idX, tcp(8080))
	drops := func() map[DropReason]uint64 {
		c, err := e.dp.Counters(e.ep1.ID)
		if err != nil {
			t.Fatal(err)
		}
		return c.Drops
	}
	for _, step := range []struct {
		what string
		in   []byte
		want uint32
		drop DropReason // with tcActShot
	}{
		{"X's first fragment (TCP 8080): allowed", toWeb(fragHdr6(nhTCP, 0, true, idX, tcp(8080))), tcActRedirect, 0},
		{"Y's first fragment (TCP 22): denied", toWeb(fragHdr6(nhTCP, 0, true, idY, tcp(22))), tcActShot, DropPolicyEgress},
		{"Y's later fragment, payload = destination options + X's fragment header + TCP 8080: denied",
			toWeb(fragHdr6(nhDstOpts, 4, false, idY, ext6(nhFrag, fakeFirstOfX))), tcActShot, DropPolicyEgress},
		{"Y's later fragment, payload = X's fragment header + TCP 8080: denied",
			toWeb(fragHdr6(nhFrag, 4, false, idY, fakeFirstOfX)), tcActShot, DropPolicyEgress},
		{"Y's later fragment, payload = a TCP header to 8080: denied (no port: its first was not seen)",
			toWeb(fragHdr6(nhTCP, 4, false, idY, tcp(8080))), tcActShot, DropPolicyEgress},
		{"X's later fragment: allowed (its first fragment's port)", toWeb(fragHdr6(nhTCP, 4, false, idX, []byte("0123456789abcdef"))), tcActRedirect, 0},
	} {
		before := drops()
		r := s.run(t, e.dp.pod.FromPod, ifH1(e), step.in)
		if r.verdict != step.want || step.want == tcActRedirect && r.redirIf != ifH2(e) {
			t.Errorf("%s: verdict %d into %d, want %d (redirect: into pod 2, %d)", step.what, r.verdict, r.redirIf, step.want, ifH2(e))
			continue
		}
		if step.want == tcActShot {
			if after := drops(); after[step.drop] != before[step.drop]+1 {
				t.Errorf("%s: %v drops +%d, want +1 (all: %v -> %v)", step.what, step.drop, after[step.drop]-before[step.drop], before, after)
			}
		}
	}
}
