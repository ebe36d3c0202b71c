package datapath

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/lanekit/lanekit/internal/testutil"
)

// TC verdicts (linux/pkt_cls.h).
const (
	tcActOK       = 0
	tcActShot     = 2
	tcActRedirect = 7
)

// skbCtx is struct __sk_buff (linux/bpf.h). BPF_PROG_TEST_RUN lets a test
// set a few of its fields (mark, priority, ifindex, cb, tstamp, wire_len,
// gso_segs, gso_size, hwtstamp) and refuses the rest non-zero: ifindex
// selects skb->dev, gso_size makes the packet a GSO packet (skb_is_gso).
// The VLAN fields cannot be set: VLAN tags are tested live (vlan_test.go).
type skbCtx struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto, Priority uint32
	IngressIfindex, Ifindex, TCIndex                                                      uint32
	CB                                                                                    [5]uint32
	Hash, TCClassid, Data, DataEnd, NapiID, Family, RemoteIP4, LocalIP4                   uint32
	RemoteIP6, LocalIP6                                                                   [4]uint32
	RemotePort, LocalPort, DataMeta                                                       uint32
	FlowKeys, Tstamp                                                                      uint64
	WireLen, GSOSegs                                                                      uint32
	Sk                                                                                    uint64
	GSOSize                                                                               uint32
	TstampType                                                                            uint8
	_                                                                                     [3]uint8
	HWTstamp                                                                              uint64
}

// fixture is one packet through one program, Katran style.
type fixture struct {
	name       string
	prog       func(e *fixtureEnv) *ebpf.Program
	ifindex    func(e *fixtureEnv) int // device the packet enters on
	in         func(e *fixtureEnv) []byte
	verdict    uint32
	redirIf    func(e *fixtureEnv) int // expected redirect target (REDIRECT only)
	redirKind  uint32
	out        func(e *fixtureEnv, in []byte) []byte // expected output bytes; nil: unchanged
	dropEP     uint32                                // endpoint charged with the drop
	dropReason DropReason
	gsoSize    uint32 // > 0: a GSO packet cut into segments of this payload size
	stackEP    uint32 // > 0: TC_ACT_OK counted as handed to the host stack for this endpoint
	// tunnel: the tunnel counters' expected growth (an env in tunnel mode
	// checks every counter; nil: none grows).
	tunnel map[TunnelStat]uint64
	// masked: offsets of output bytes the program derives from what a
	// fixture cannot predict (a flow hash, a random IP ID, the checksum over
	// them): taken from the output before comparing (an IPv4 header's
	// checksum is still checked).
	masked []int
}

func fromPod(e *fixtureEnv) *ebpf.Program    { return e.dp.pod.FromPod }
func fromUplink(e *fixtureEnv) *ebpf.Program { return e.dp.uplink.FromUplink }
func ifH1(e *fixtureEnv) int                 { return e.h1.Attrs().Index }
func ifH2(e *fixtureEnv) int                 { return e.h2.Attrs().Index }
func ifUp(e *fixtureEnv) int                 { return e.up.Attrs().Index }
func ifH3(e *fixtureEnv) int                 { return e.h3.Attrs().Index }

// routed returns in with new MACs and the TTL decremented (checksum patched).
func routed(in []byte, dst, src net.HardwareAddr) []byte {
	out := bytes.Clone(in)
	if dst != nil {
		copy(out[0:6], dst)
		copy(out[6:12], src)
	}
	out[14+8]--
	binary.BigEndian.PutUint16(out[14+10:], testutil.IPv4Checksum(out[14:34]))
	return out
}

func fixtures() []fixture {
	gw := DefaultGatewayIP.String()
	return []fixture{
		{
			name: "pod to local pod: redirect_peer into pod 2", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.1.11", 64)
			},
			verdict: tcActRedirect, redirIf: ifH2, redirKind: 2,
			out: func(e *fixtureEnv, in []byte) []byte { return routed(in, pod2MAC, e.ep2.HostMAC) },
		},
		{
			name: "pod to remote pod, neighbour known: rewrite and redirect out of the uplink", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.2.5", 64)
			},
			verdict: tcActRedirect, redirIf: ifUp, redirKind: 1,
			out: func(e *fixtureEnv, in []byte) []byte { return routed(in, e.neighMAC, e.up.Attrs().HardwareAddr) },
		},
		{
			name: "pod to remote pod, neighbour unresolved: redirect_neigh out of the uplink", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.3.5", 64)
			},
			verdict: tcActRedirect, redirIf: ifUp, redirKind: 3,
			out: func(e *fixtureEnv, in []byte) []byte { return routed(in, nil, nil) },
		},
		{
			name: "pod to the host's own address: pass to the stack", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.77.0.1", 64)
			},
			verdict: tcActOK, stackEP: 1,
		},
		{
			name: "pod with TTL 1: pass to the stack for ICMP time exceeded", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.2.5", 1)
			},
			verdict: tcActOK, stackEP: 1,
		},
		{
			name: "spoofed source IP: drop", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.99", "10.244.2.5", 64)
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropSpoofedIP,
		},
		{
			name: "spoofed source MAC: drop", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.ep1.HostMAC, pod2MAC, "10.244.1.10", "10.244.2.5", 64)
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropSpoofedMAC,
		},
		{
			name: "pod on pod 2's device claiming pod 1's address: drop", prog: fromPod, ifindex: ifH2,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.ep2.HostMAC, pod2MAC, "10.244.1.10", "10.244.2.5", 64)
			},
			verdict: tcActShot, dropEP: 2, dropReason: DropSpoofedIP,
		},
		{
			name: "blackhole route: drop", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.99.1.1", 64)
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropFIBFailed,
		},
		{
			name: "unreachable route: drop", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.98.1.1", 64)
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropFIBFailed,
		},
		{
			name: "ARP request for the gateway: answered with the host MAC", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.ARPFrame(1, pod1MAC, "10.244.1.10", make(net.HardwareAddr, 6), gw)
			},
			verdict: tcActRedirect, redirIf: ifH1, redirKind: 2,
			out: func(e *fixtureEnv, in []byte) []byte {
				return testutil.ARPFrame(2, e.ep1.HostMAC, gw, pod1MAC, "10.244.1.10")
			},
		},
		{
			name: "ARP reply to the host's own request: pass", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.ARPFrame(2, pod1MAC, "10.244.1.10", e.ep1.HostMAC, "10.77.0.1")
			},
			verdict: tcActOK,
		},
		{
			name: "ARP request for another address: pass", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.ARPFrame(1, pod1MAC, "10.244.1.10", make(net.HardwareAddr, 6), "10.244.1.1")
			},
			verdict: tcActOK,
		},
		{
			name: "ARP claiming another pod's IP: drop", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.ARPFrame(1, pod1MAC, "10.244.1.11", make(net.HardwareAddr, 6), gw)
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropSpoofedIP,
		},
		{
			name: "ARP with a foreign sender MAC: drop", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.ARPFrame(1, pod2MAC, "10.244.1.10", make(net.HardwareAddr, 6), gw)
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropSpoofedMAC,
		},
		{
			name: "device without an endpoint: drop", prog: fromPod, ifindex: ifUp,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.up.Attrs().HardwareAddr, pod1MAC, "10.244.1.10", "10.244.2.5", 64)
			},
			verdict: tcActShot, dropEP: 0, dropReason: DropUnknownEP,
		},
		{
			// (A frame shorter than an IPv4 header cannot be fed to
			// BPF_PROG_TEST_RUN: the kernel refuses it with EINVAL.)
			name: "IPv4 ethertype with version 6 in the header: drop", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				b := testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.2.5", 64)
				b[14] = 0x65
				return b
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropMalformed,
		},
		{
			name: "IPv4 header length below 20 bytes: drop", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				b := testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.2.5", 64)
				b[14] = 0x44
				return b
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropMalformed,
		},
		{
			name: "IPv6 from an IPv4-only endpoint: drop", prog: fromPod, ifindex: ifH1,
			in:      func(e *fixtureEnv) []byte { return testutil.IPv6Frame(e.ep1.HostMAC, pod1MAC) },
			verdict: tcActShot, dropEP: 1, dropReason: DropUnsupported,
		},
		{
			name: "uplink: IPv4 for a local pod goes straight into it", prog: fromUplink, ifindex: ifUp,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.up.Attrs().HardwareAddr, neighMAC, "10.244.2.5", "10.244.1.10", 63)
			},
			verdict: tcActRedirect, redirIf: ifH1, redirKind: 2,
			out: func(e *fixtureEnv, in []byte) []byte { return routed(in, pod1MAC, e.ep1.HostMAC) },
		},
		{
			name: "pod to local VM: through the VM device's transmit path", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.1.12", 64)
			},
			verdict: tcActRedirect, redirIf: ifH3, redirKind: 1,
			out: func(e *fixtureEnv, in []byte) []byte { return routed(in, vm3MAC, e.ep3.HostMAC) },
		},
		{
			name: "uplink: IPv4 for a local VM: through the VM device's transmit path", prog: fromUplink, ifindex: ifUp,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.up.Attrs().HardwareAddr, neighMAC, "10.244.2.5", "10.244.1.12", 63)
			},
			verdict: tcActRedirect, redirIf: ifH3, redirKind: 1,
			out: func(e *fixtureEnv, in []byte) []byte { return routed(in, vm3MAC, e.ep3.HostMAC) },
		},
		{
			name: "VM's ARP request for the gateway: answered back through its device", prog: fromPod, ifindex: ifH3,
			in: func(e *fixtureEnv) []byte {
				return testutil.ARPFrame(1, vm3MAC, "10.244.1.12", make(net.HardwareAddr, 6), gw)
			},
			verdict: tcActRedirect, redirIf: ifH3, redirKind: 1,
			out: func(e *fixtureEnv, in []byte) []byte {
				return testutil.ARPFrame(2, e.ep3.HostMAC, gw, vm3MAC, "10.244.1.12")
			},
		},
		{
			name: "uplink: IPv4 for the host: pass", prog: fromUplink, ifindex: ifUp,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.up.Attrs().HardwareAddr, neighMAC, "10.77.0.2", "10.77.0.1", 64)
			},
			verdict: tcActOK,
		},
		{
			name: "uplink: frame for another MAC is not ours: pass", prog: fromUplink, ifindex: ifUp,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(mustMAC("02:00:00:99:99:99"), neighMAC, "10.244.2.5", "10.244.1.10", 64)
			},
			verdict: tcActOK,
		},
		{
			name: "uplink: TTL 1 for a local pod: pass to the stack", prog: fromUplink, ifindex: ifUp,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.up.Attrs().HardwareAddr, neighMAC, "10.244.2.5", "10.244.1.10", 1)
			},
			verdict: tcActOK,
		},
		{
			name: "uplink: ARP: pass", prog: fromUplink, ifindex: ifUp,
			in: func(e *fixtureEnv) []byte {
				return testutil.ARPFrame(1, neighMAC, "10.77.0.2", make(net.HardwareAddr, 6), "10.77.0.1")
			},
			verdict: tcActOK,
		},
	}
}

func TestFixtures(t *testing.T) {
	runFixtures(t, newFixtureEnv(t), append(fixtures(), edgeFixtures()...))
}

// runFixtures runs each fixture as a subtest on e: verdict, output bytes,
// redirect target and kind, and the drop / to-stack counters.
func runFixtures(t *testing.T, e *fixtureEnv, fs []fixture) {
	for _, f := range fs {
		t.Run(f.name, func(t *testing.T) {
			e.enter(t)
			in := f.in(e)
			var before, beforeStack Counters
			if f.dropReason != DropNone {
				var err error
				if before, err = e.dp.Counters(f.dropEP); err != nil {
					t.Fatal(err)
				}
			}
			if f.stackEP != 0 {
				var err error
				if beforeStack, err = e.dp.Counters(f.stackEP); err != nil {
					t.Fatal(err)
				}
			}
			var beforeTunnel TunnelStats
			if e.tunnel {
				var err error
				if beforeTunnel, err = e.dp.TunnelStats(); err != nil {
					t.Fatal(err)
				}
			}
			if err := e.dp.pod.LastRedirect.Set(podRedirectTrace{}); err != nil {
				t.Fatal(err)
			}
			if err := e.dp.uplink.LastRedirect.Set(uplinkRedirectTrace{}); err != nil {
				t.Fatal(err)
			}
			out := make([]byte, len(in)+256)
			ctx := skbCtx{Ifindex: uint32(f.ifindex(e))}
			if f.gsoSize > 0 {
				ctx.GSOSize = f.gsoSize
				ctx.GSOSegs = (uint32(len(in)) + f.gsoSize - 1) / f.gsoSize
			}
			opts := &ebpf.RunOptions{Data: bytes.Clone(in), DataOut: out, Context: ctx}
			ret, err := f.prog(e).Run(opts)
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			if ret != f.verdict {
				t.Fatalf("verdict %d, want %d", ret, f.verdict)
			}
			got := opts.DataOut
			want := in
			if f.out != nil {
				want = f.out(e, in)
			}
			if len(f.masked) > 0 && len(got) == len(want) {
				want = bytes.Clone(want)
				for _, i := range f.masked {
					want[i] = got[i]
				}
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("output bytes differ\n got %x\nwant %x", got, want)
			}
			if f.out != nil && len(got) > 34 && got[12] == 0x08 && got[13] == 0 {
				if h := got[14 : 14+int(got[14]&0xf)*4]; binary.BigEndian.Uint16(h[10:]) != testutil.IPv4Checksum(h) {
					t.Fatalf("IPv4 checksum invalid after rewrite: %x", h)
				}
			}
			if f.verdict == tcActRedirect {
				var tr podRedirectTrace
				var utr uplinkRedirectTrace
				if err := e.dp.pod.LastRedirect.Get(&tr); err != nil {
					t.Fatal(err)
				}
				if err := e.dp.uplink.LastRedirect.Get(&utr); err != nil {
					t.Fatal(err)
				}
				if tr.Kind == 0 {
					tr = podRedirectTrace(utr)
				}
				if int(tr.Ifindex) != f.redirIf(e) || tr.Kind != f.redirKind {
					t.Fatalf("redirect to ifindex %d kind %d, want ifindex %d kind %d", tr.Ifindex, tr.Kind, f.redirIf(e), f.redirKind)
				}
			}
			if f.stackEP != 0 {
				after, err := e.dp.Counters(f.stackEP)
				if err != nil {
					t.Fatal(err)
				}
				if f.verdict != tcActOK || after.StackPackets-beforeStack.StackPackets != 1 {
					t.Fatalf("to-stack counter of endpoint %d grew by %d (verdict %d), want 1 with TC_ACT_OK",
						f.stackEP, after.StackPackets-beforeStack.StackPackets, f.verdict)
				}
			}
			if f.dropReason != DropNone {
				after, err := e.dp.Counters(f.dropEP)
				if err != nil {
					t.Fatal(err)
				}
				if d := after.Drops[f.dropReason] - before.Drops[f.dropReason]; d != 1 {
					t.Fatalf("drop counter %s of endpoint %d grew by %d, want 1", f.dropReason, f.dropEP, d)
				}
			}
			if e.tunnel {
				after, err := e.dp.TunnelStats()
				if err != nil {
					t.Fatal(err)
				}
				for k := TunnelStat(0); int(k) < tunnelStatMax; k++ {
					if d := after[k] - beforeTunnel[k]; d != f.tunnel[k] {
						t.Errorf("tunnel counter %s grew by %d, want %d", k, d, f.tunnel[k])
					}
				}
			}
		})
	}
}

// A netkit L2 pod is a veth pod to the programs (MACs checked, ARP
// answered): the veth fixture table, with pods 1 and 2 rewritten as
// netkit-l2 endpoints (map entries only: this kernel may lack netkit), gives
// the same verdicts, bytes and counters.
func TestFixturesNetkitL2(t *testing.T) {
	e := newFixtureEnv(t)
	for _, ep := range []*Endpoint{&e.ep1, &e.ep2} {
		ep.Mode = ModeNetkitL2
		info := ep.info()
		if err := e.dp.pod.LkEpByIfindex.Put(uint32(ep.IfIndex), info); err != nil {
			t.Fatal(err)
		}
		if err := e.dp.pod.LkEndpoints.Put(info.Ip, info); err != nil {
			t.Fatal(err)
		}
	}
	runFixtures(t, e, fixtures())
}
