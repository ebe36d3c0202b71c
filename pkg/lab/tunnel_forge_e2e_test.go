package lab

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/lanekit/lanekit/pkg/datapath"
)

// forgeVXLAN is what an attacker runs: it sends n VXLAN datagrams to
// node:port, each carrying a TCP SYN src -> dst:dport inside an inner frame
// addressed to the tunnel MAC, with the given VNI (the permitted client's),
// then listens 1.5 s for the server's answers (a raw TCP socket sees the
// SYN-ACKs whatever the kernel then does with them) when listen is 1.
// Prints {"sent": N, "replies": M}.
const forgeVXLAN = `import socket,struct,sys,json,time
node,port,vni,src,dst,dport,n,listen=sys.argv[1],int(sys.argv[2]),int(sys.argv[3]),sys.argv[4],sys.argv[5],int(sys.argv[6]),int(sys.argv[7]),sys.argv[8]=="1"
def csum(b):
    if len(b)%2: b+=b"\0"
    s=sum(struct.unpack("!%dH"%(len(b)//2),b))
    while s>>16: s=(s&0xffff)+(s>>16)
    return ~s&0xffff
tcp=struct.pack("!HHIIBBHHH",41234,dport,1000,0,5<<4,0x02,64240,0,0)
ph=socket.inet_aton(src)+socket.inet_aton(dst)+struct.pack("!BBH",0,6,len(tcp))
tcp=tcp[:16]+struct.pack("!H",csum(ph+tcp))+tcp[18:]
ip=struct.pack("!BBHHHBBH4s4s",0x45,0,20+len(tcp),1,0x4000,64,6,0,socket.inet_aton(src),socket.inet_aton(dst))
ip=ip[:10]+struct.pack("!H",csum(ip))+ip[12:]
eth=bytes.fromhex("024c4b544e4c024c4b544e530800")
pkt=struct.pack("!II",0x08000000,vni<<8)+eth+ip+tcp
r=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_TCP) if listen else None
u=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
sent=0
for i in range(n):
    try:
        u.sendto(pkt,(node,port)); sent+=1
    except OSError: pass
    time.sleep(0.05)
replies=0
if r:
    r.settimeout(0.2); end=time.time()+1.5
    while time.time()<end:
        try: d=r.recv(2048)
        except socket.timeout: continue
        h=(d[0]&15)*4
        if socket.inet_ntoa(d[12:16])==dst and struct.unpack("!H",d[h:h+2])[0]==dport: replies+=1
print(json.dumps({"sent":sent,"replies":replies}))
`

// forgeResult is forgeVXLAN's answer.
type forgeResult struct {
	Sent    int `json:"sent"`
	Replies int `json:"replies"`
}

// forge runs forgeVXLAN in netns ns.
func forge(t *testing.T, ns, node string, vni uint32, src, dst string, n int, listen bool) forgeResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := "0"
	if listen {
		l = "1"
	}
	out, err := inNS(ctx, ns, "python3", "-c", forgeVXLAN, node, fmt.Sprint(TunnelPort), fmt.Sprint(vni), src, dst, "8080", fmt.Sprint(n), l)
	if err != nil {
		t.Fatalf("forge VXLAN in %s: %v\n%s", ns, err, out)
	}
	var r forgeResult
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &r); err != nil {
		t.Fatalf("forge VXLAN in %s: %v: %q", ns, err, out)
	}
	return r
}

// observedVNI is the VNI node's datapath puts on pod ip's packets (its
// lk_policy_ipcache identity through lk_tunnel_vni): what anyone on the wire
// sees in that pod's VXLAN.
func observedVNI(t *testing.T, node int, ip string) uint32 {
	t.Helper()
	open := func(name string) *ebpf.Map {
		m, err := ebpf.LoadPinnedMap(filepath.Join(BPFDir(node), name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	var id, vni uint32
	if err := open("lk_policy_ipcache").Lookup(binary.NativeEndian.Uint32(netip.MustParseAddr(ip).AsSlice()), &id); err != nil {
		t.Fatalf("identity of %s on node %d: %v", ip, node, err)
	}
	if err := open("lk_tunnel_vni").Lookup(id, &vni); err != nil || vni == 0 {
		t.Fatalf("VNI of identity %d on node %d: %d, %v", id, node, vni, err)
	}
	return vni
}

// testForgedVXLAN: the attacker's side of the tunnel. web (node 1) admits
// only role=client pods; client (node 2) gets through. mallory (node 2,
// another label) is denied directly. Then:
//   - mallory sends VXLAN to node 1's tunnel port with the client's VNI and
//     its own address inside (so that answers would come back to it): its
//     node drops every datagram (tunnel-port, on mallory's counters), web
//     receives nothing, no SYN-ACK comes back;
//   - a host on the underlay that is no node (the raw host) sends the same
//     with the client's own address inside: node 1's from_tunnel drops it
//     (tunnel-unknown-node, on node 1's counters), web receives nothing;
//   - node 2 itself (a known outer source) speaks for an address that is
//     not its own (a node 1 pod address) with the client's VNI: dropped
//     (tunnel-foreign-source), web receives nothing.
//
// Then client still gets through: nothing of the legitimate path was lost.
func testForgedVXLAN(t *testing.T, ask func(from string) int, web, client, mallory string) {
	vni := observedVNI(t, 2, client)
	webCounters := func() datapath.Counters {
		t.Helper()
		_, c, err := datapath.PinnedCounters(BPFDir(1), netip.MustParseAddr(web))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	nodeDrops := func(r datapath.DropReason) uint64 {
		t.Helper()
		c, err := datapath.PinnedNodeCounters(BPFDir(1))
		if err != nil {
			t.Fatal(err)
		}
		return c.Drops[r]
	}
	const n = 5
	if got := ask("mallory"); got != 0 {
		t.Fatalf("mallory -> web directly: %d answers, want 0 (the policy admits role=client only)", got)
	}
	t.Run("a pod's VXLAN with the client's VNI: dropped at its node", func(t *testing.T) {
		_, before, err := datapath.PinnedCounters(BPFDir(2), netip.MustParseAddr(mallory))
		if err != nil {
			t.Fatal(err)
		}
		wb := webCounters()
		r := forge(t, NamedPodNS("mallory"), UnderlayIP(1), vni, mallory, web, n, true)
		_, after, err := datapath.PinnedCounters(BPFDir(2), netip.MustParseAddr(mallory))
		if err != nil {
			t.Fatal(err)
		}
		drops := after.Drops[datapath.DropTunnelPort] - before.Drops[datapath.DropTunnelPort]
		delivered := webCounters().ToPackets - wb.ToPackets
		t.Logf("mallory sent %d forged datagrams: %d tunnel-port drops on node 2, %d packets delivered to web, %d SYN-ACKs back", r.Sent, drops, delivered, r.Replies)
		if r.Sent != n || drops != n {
			t.Errorf("%d of %d forged datagrams counted as tunnel-port drops on mallory's node", drops, r.Sent)
		}
		if delivered != 0 || r.Replies != 0 {
			t.Errorf("web received %d packets and answered %d times: the forged VNI admitted mallory", delivered, r.Replies)
		}
	})
	t.Run("VXLAN from a host that is no node: dropped by from_tunnel", func(t *testing.T) {
		before, wb := nodeDrops(datapath.DropTunnelUnknownNode), webCounters()
		r := forge(t, RawNS(1), UnderlayIP(1), vni, client, web, n, false)
		drops := nodeDrops(datapath.DropTunnelUnknownNode) - before
		delivered := webCounters().ToPackets - wb.ToPackets
		t.Logf("the raw host sent %d: %d tunnel-unknown-node drops on node 1, %d delivered to web", r.Sent, drops, delivered)
		if r.Sent != n || drops != n || delivered != 0 {
			t.Errorf("sent %d, node 1 counted %d tunnel-unknown-node drops, web received %d: want %d, %d, 0", r.Sent, drops, delivered, n, n)
		}
	})
	t.Run("node 2 speaking for an address not its own: dropped by from_tunnel", func(t *testing.T) {
		before, wb := nodeDrops(datapath.DropTunnelForeignSrc), webCounters()
		foreign := netip.MustParseAddr(web).Next().String() // node 1's pod CIDR
		r := forge(t, NodeNS(2), UnderlayIP(1), vni, foreign, web, n, false)
		drops := nodeDrops(datapath.DropTunnelForeignSrc) - before
		delivered := webCounters().ToPackets - wb.ToPackets
		t.Logf("node 2 sent %d with inner source %s: %d tunnel-foreign-source drops on node 1, %d delivered to web", r.Sent, foreign, drops, delivered)
		if r.Sent != n || drops != n || delivered != 0 {
			t.Errorf("sent %d, node 1 counted %d tunnel-foreign-source drops, web received %d: want %d, %d, 0", r.Sent, drops, delivered, n, n)
		}
	})
	if got := ask("client"); got != 3 {
		t.Fatalf("client -> web after the forgeries: %d answers, want 3", got)
	}
}
