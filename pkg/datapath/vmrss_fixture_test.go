package datapath

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/xsk"
	"github.com/vishvananda/netlink"
)

// msKey is the key of Microsoft's RSS verification suite (the default of
// `lanekit rss hash`).
var msKey = [40]byte{
	0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
	0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
	0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
}

// Hash types and report types (linux/virtio_net.h).
const (
	rssTypeIPv4  = 1 << 0
	rssTypeTCPv4 = 1 << 1
	rssTypeUDPv4 = 1 << 2
	reportIPv4   = 1
	reportTCPv4  = 2
	reportUDPv4  = 3
)

// toeplitz is the textbook bit loop, independent of the BPF code.
func toeplitz(key [40]byte, in []byte) uint32 {
	var h uint32
	for i, b := range in {
		for bit := 0; bit < 8; bit++ {
			if b&(0x80>>bit) == 0 {
				continue
			}
			// the 32 key bits starting at bit 8*i+bit
			var w uint32
			for k := 0; k < 32; k++ {
				kb := 8*i + bit + k
				if kb/8 < len(key) && key[kb/8]&(0x80>>(kb%8)) != 0 {
					w |= 1 << (31 - k)
				}
			}
			h ^= w
		}
	}
	return h
}

func rssTCPFrame(dst, src []byte, saddr, daddr string, sport, dport uint16) []byte {
	f := testutil.IPv4Frame(dst, src, saddr, daddr, 63)
	f[23] = 6 // TCP; the ports sit where UDP's do
	binary.BigEndian.PutUint16(f[34:], sport)
	binary.BigEndian.PutUint16(f[36:], dport)
	binary.BigEndian.PutUint16(f[24:], 0)
	binary.BigEndian.PutUint16(f[24:], testutil.IPv4Checksum(f[14:34]))
	return f
}

func tupleInput(saddr, daddr string, sport, dport uint16) []byte {
	s, d := netip.MustParseAddr(saddr).As4(), netip.MustParseAddr(daddr).As4()
	in := append(s[:], d[:]...)
	return binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(in, sport), dport)
}

func setVMRSS(t *testing.T, l *Loader, id uint32, c VMRSS) {
	t.Helper()
	spec, err := loadVm()
	if err != nil {
		t.Fatal(err)
	}
	if err := l.ensureVMRSS(spec, id); err != nil {
		t.Fatal(err)
	}
	m, err := l.VMRSSMap(VM{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.ValueSize() != VMRSSValueSize || m.Flags()&1024 == 0 { // BPF_F_MMAPABLE
		t.Fatalf("rss map: value size %d flags %#x, want %d and BPF_F_MMAPABLE", m.ValueSize(), m.Flags(), VMRSSValueSize)
	}
	if err := m.Put(uint32(0), c); err != nil {
		t.Fatal(err)
	}
}

// TestVMRSSMetadata: with a guest hash configuration, steer_vm puts the
// Toeplitz hash of the frame and its report type in front of it; the values
// are the published verification vectors (what `lanekit rss hash` prints for
// the same tuple and key). Without a configuration, or with one the backend
// is rewriting (odd seq), no metadata.
func TestVMRSSMetadata(t *testing.T) {
	e := newFixtureEnv(t)
	ifx := addVethSpec(t, &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lk-fx-rv", NumRxQueues: 1, NumTxQueues: 1},
		PeerName: "lk-fx-rvp"}).Attrs().Index
	vmMAC := mustMAC("02:00:00:01:00:2a")
	vm := VM{ID: 21, IfIndex: ifx, MAC: vmMAC, Queues: 1, XSKBase: 30}
	steer := e.loadSteer(t, vm)
	attachSteer(t, ifx, steer)
	sock, err := xsk.Open(ifx, 0, xsk.Sizes{FrameSize: 2048, FrameCount: 64, FillSize: 64, CompSize: 64, RxSize: 64, TxSize: 64})
	if err != nil {
		t.Fatalf("open AF_XDP socket: %v", err)
	}
	t.Cleanup(func() { sock.Close() })
	if err := e.dp.SetVMSocket(vm, 0, sock.FD); err != nil {
		t.Fatal(err)
	}

	// Microsoft's vectors: 66.9.149.187:2794 -> 161.142.100.80:1766.
	const (
		src, dst        = "66.9.149.187", "161.142.100.80"
		sport, dport    = 2794, 1766
		wantTCP, wantIP = 0x51ccc178, 0x323e8fc2
	)
	if h := toeplitz(msKey, tupleInput(src, dst, sport, dport)); h != wantTCP {
		t.Fatalf("reference toeplitz %#x, want %#x", h, uint32(wantTCP))
	}
	frame := rssTCPFrame(vmMAC, neighMAC, src, dst, sport, dport)
	meta := func(t *testing.T) (hash uint32, report uint16, ok bool) {
		t.Helper()
		out := make([]byte, len(frame)+64)
		var ctxOut xdpCtx
		ret, err := steer.SteerVm.Run(&ebpf.RunOptions{Data: bytes.Clone(frame), DataOut: out,
			Context: xdpCtx{DataEnd: uint32(len(frame)), IngressIfindex: uint32(ifx)}, ContextOut: &ctxOut})
		if err != nil || ret != xdpRedirect {
			t.Fatalf("run: verdict %d, %v; want XDP_REDIRECT", ret, err)
		}
		metaLen := ctxOut.Data - ctxOut.DataMeta
		if metaLen == 0 {
			return 0, 0, false
		}
		if metaLen != 8 || !bytes.Equal(out[metaLen:metaLen+uint32(len(frame))], frame) {
			t.Fatalf("metadata %d bytes (want 8) in front of %x", metaLen, out)
		}
		m := out[:8]
		if binary.NativeEndian.Uint16(m[6:]) != 0x4c4b {
			t.Fatalf("metadata magic %x", m[6:])
		}
		return binary.NativeEndian.Uint32(m), binary.NativeEndian.Uint16(m[4:]), true
	}

	t.Run("no guest configuration: no metadata", func(t *testing.T) {
		e.enter(t)
		if _, _, ok := meta(t); ok {
			t.Fatal("metadata without a configuration")
		}
	})
	cfg, err := NewVMRSS(msKey, rssTypeIPv4|rssTypeTCPv4, []uint16{0}, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("TCPv4 enabled: the TCP vector", func(t *testing.T) {
		e.enter(t)
		setVMRSS(t, e.dp, vm.ID, cfg)
		if h, r, ok := meta(t); !ok || h != wantTCP || r != reportTCPv4 {
			t.Fatalf("hash %#x report %d (metadata %t), want %#x report %d", h, r, ok, uint32(wantTCP), reportTCPv4)
		}
	})
	t.Run("IPv4 only: the address-only vector", func(t *testing.T) {
		e.enter(t)
		c := cfg
		c.HashTypes = rssTypeIPv4
		setVMRSS(t, e.dp, vm.ID, c)
		if h, r, ok := meta(t); !ok || h != wantIP || r != reportIPv4 {
			t.Fatalf("hash %#x report %d (metadata %t), want %#x report %d", h, r, ok, uint32(wantIP), reportIPv4)
		}
	})
	t.Run("UDP only, TCP frame: metadata says no hash", func(t *testing.T) {
		e.enter(t)
		c := cfg
		c.HashTypes = rssTypeUDPv4
		setVMRSS(t, e.dp, vm.ID, c)
		if h, r, ok := meta(t); !ok || h != 0 || r != 0 {
			t.Fatalf("hash %#x report %d (metadata %t), want metadata with report NONE", h, r, ok)
		}
	})
	t.Run("entry being rewritten (odd seq): no metadata", func(t *testing.T) {
		e.enter(t)
		c := cfg
		c.Seq = 1
		setVMRSS(t, e.dp, vm.ID, c)
		if _, _, ok := meta(t); ok {
			t.Fatal("metadata from a half-written entry")
		}
	})
}

// TestVMRSSQueueChoice: for a 4-queue VM whose guest set an RSS table, the
// uplink program picks rx queue table[toeplitz & mask] (queue_mapping =
// queue + 1); with HASH_CONFIG only (no steering) or no configuration, the
// flow hash as before. Every flow keeps its queue.
func TestVMRSSQueueChoice(t *testing.T) {
	e := newFixtureEnv(t)
	saddr, daddr := "10.244.2.5", e.ep5.IP.String()
	queueOf := func(t *testing.T, sport uint16) uint32 {
		t.Helper()
		frame := rssTCPFrame(e.up.Attrs().HardwareAddr, neighMAC, saddr, daddr, sport, 5201)
		if err := e.dp.uplink.LastRedirect.Set(uplinkRedirectTrace{}); err != nil {
			t.Fatal(err)
		}
		ret, err := e.dp.uplink.FromUplink.Run(&ebpf.RunOptions{Data: frame, Context: skbCtx{Ifindex: uint32(ifUp(e))}})
		if err != nil || ret != tcActRedirect {
			t.Fatalf("run: verdict %d, %v; want redirect", ret, err)
		}
		var tr uplinkRedirectTrace
		if err := e.dp.uplink.LastRedirect.Get(&tr); err != nil {
			t.Fatal(err)
		}
		return tr.QueueMapping
	}
	// A table that is not round robin: entry i -> (i*7/3) % 4, 16 entries.
	table := make([]uint16, 16)
	for i := range table {
		table[i] = uint16(i * 7 / 3 % 4)
	}
	cfg, err := NewVMRSS(msKey, rssTypeIPv4|rssTypeTCPv4, table, 3)
	if err != nil {
		t.Fatal(err)
	}
	e.enter(t)
	flowHash := map[uint16]uint32{}
	for sport := uint16(40000); sport < 40032; sport++ {
		flowHash[sport] = queueOf(t, sport)
	}
	setVMRSS(t, e.dp, e.ep5.ID, cfg)
	differ := 0
	for sport := uint16(40000); sport < 40032; sport++ {
		h := toeplitz(msKey, tupleInput(saddr, daddr, sport, 5201))
		want := uint32(table[h&15]) + 1
		if q := queueOf(t, sport); q != want {
			t.Fatalf("flow from port %d: queue_mapping %d, want %d (hash %#x, table[%d])", sport, q, want, h, h&15)
		}
		if flowHash[sport] != want {
			differ++
		}
	}
	if differ == 0 {
		t.Fatal("the guest table chose the flow-hash queue for every flow: the test cannot tell them apart")
	}
	// HASH_CONFIG only: the flow hash keeps choosing.
	c := cfg
	c.Steer = 0
	setVMRSS(t, e.dp, e.ep5.ID, c)
	for sport := uint16(40000); sport < 40032; sport++ {
		if q := queueOf(t, sport); q != flowHash[sport] {
			t.Fatalf("hash-only config moved flow %d from %d to %d", sport, flowHash[sport], q)
		}
	}
	// Not IPv4 TCP-hashable (UDP with only TCPv4 enabled and no IPv4 type):
	// the unclassified queue.
	c = cfg
	c.HashTypes = rssTypeTCPv4
	setVMRSS(t, e.dp, e.ep5.ID, c)
	udp := testutil.IPv4Frame(e.up.Attrs().HardwareAddr, neighMAC, saddr, daddr, 63)
	if err := e.dp.uplink.LastRedirect.Set(uplinkRedirectTrace{}); err != nil {
		t.Fatal(err)
	}
	if ret, err := e.dp.uplink.FromUplink.Run(&ebpf.RunOptions{Data: udp, Context: skbCtx{Ifindex: uint32(ifUp(e))}}); err != nil || ret != tcActRedirect {
		t.Fatalf("run: %d %v", ret, err)
	}
	var tr uplinkRedirectTrace
	if err := e.dp.uplink.LastRedirect.Get(&tr); err != nil {
		t.Fatal(err)
	}
	if tr.QueueMapping != 4 {
		t.Fatalf("unhashable frame: queue_mapping %d, want unclassified queue 3 + 1", tr.QueueMapping)
	}
	_ = reportUDPv4
}
