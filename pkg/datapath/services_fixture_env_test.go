package datapath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/service"
)

// The service fixtures' environment and packet helpers: frames with valid
// checksums, their parsed tuples, services as Kubernetes YAML, and a Go
// mirror of the BPF flow hash.

const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

// l4Frame builds Ethernet + IPv4 + TCP (flags) or UDP (flags ignored) with
// valid checksums.
func l4Frame(dst, src net.HardwareAddr, saddr string, sport uint16, daddr string, dport uint16, proto uint8,
	flags uint8, seq, ack uint32, payload []byte) []byte {
	l4len := 8
	if proto == 6 {
		l4len = 20
	}
	b := testutil.EthIPv4(dst, src, saddr, daddr, 64, proto, l4len+len(payload))
	l4 := b[34:]
	binary.BigEndian.PutUint16(l4[0:], sport)
	binary.BigEndian.PutUint16(l4[2:], dport)
	csumOff := 6
	if proto == 6 {
		binary.BigEndian.PutUint32(l4[4:], seq)
		binary.BigEndian.PutUint32(l4[8:], ack)
		l4[12] = 5 << 4
		l4[13] = flags
		binary.BigEndian.PutUint16(l4[14:], 65535)
		csumOff = 16
	} else {
		binary.BigEndian.PutUint16(l4[4:], uint16(8+len(payload)))
	}
	copy(l4[l4len:], payload)
	binary.BigEndian.PutUint16(l4[csumOff:], l4Checksum(b))
	return b
}

// l4Checksum computes the TCP/UDP checksum of frame (checksum field zeroed first).
func l4Checksum(frame []byte) uint16 {
	proto := frame[23]
	l4 := bytes.Clone(frame[34:])
	off := 6
	if proto == 6 {
		off = 16
	}
	l4[off], l4[off+1] = 0, 0
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	add(frame[26:34])
	sum += uint32(proto) + uint32(len(l4))
	add(l4)
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	c := ^uint16(sum)
	if c == 0 && proto == 17 {
		c = 0xffff
	}
	return c
}

// tuple reads addresses and ports of an Ethernet + IPv4 + TCP/UDP frame.
type tuple struct {
	src, dst     netip.AddrPort
	proto, flags uint8
	seq, ack     uint32
}

func parseTuple(t *testing.T, b []byte) tuple {
	t.Helper()
	if len(b) < 34+8 {
		t.Fatalf("frame too short: %x", b)
	}
	var s, d [4]byte
	copy(s[:], b[26:30])
	copy(d[:], b[30:34])
	tp := tuple{
		src:   netip.AddrPortFrom(netip.AddrFrom4(s), binary.BigEndian.Uint16(b[34:])),
		dst:   netip.AddrPortFrom(netip.AddrFrom4(d), binary.BigEndian.Uint16(b[36:])),
		proto: b[23],
	}
	if tp.proto == 6 && len(b) >= 54 {
		tp.seq = binary.BigEndian.Uint32(b[38:])
		tp.ack = binary.BigEndian.Uint32(b[42:])
		tp.flags = b[47]
	}
	return tp
}

// lbFlowHash mirrors lb_flow_hash (bpf/lib/lb.h): jhash_3words over the
// tuple as the program loads it (little-endian host).
func lbFlowHash(saddr netip.Addr, sport uint16, daddr netip.Addr, dport uint16, proto uint8) uint32 {
	s4, d4 := saddr.As4(), daddr.As4()
	var sp, dp [2]byte
	binary.BigEndian.PutUint16(sp[:], sport)
	binary.BigEndian.PutUint16(dp[:], dport)
	a := binary.LittleEndian.Uint32(s4[:])
	b := binary.LittleEndian.Uint32(d4[:])
	c := uint32(binary.LittleEndian.Uint16(sp[:]))<<16 | uint32(binary.LittleEndian.Uint16(dp[:]))
	rol := func(w uint32, s int) uint32 { return w<<s | w>>(32-s) }
	a += 0xdeadbeef + 12 + uint32(proto)
	b += 0xdeadbeef + 12
	c += 0xdeadbeef + 12
	c ^= b
	c -= rol(b, 14)
	a ^= c
	a -= rol(c, 11)
	b ^= a
	b -= rol(a, 25)
	c ^= b
	c -= rol(b, 16)
	a ^= c
	a -= rol(c, 4)
	b ^= a
	b -= rol(a, 14)
	c ^= b
	c -= rol(b, 24)
	return c
}

// svcEnv is a fixture namespace plus the service translation state.
type svcEnv struct {
	*fixtureEnv
	model  *service.Model
	tables *service.Tables
	node   netip.Addr
}

func newSvcEnv(t *testing.T) *svcEnv {
	return newSvcEnvCfg(t, nil)
}

func newSvcEnvCfg(t *testing.T, adjust func(*Config)) *svcEnv {
	e := newFixtureEnvCfg(t, adjust)
	node := netip.MustParseAddr("10.77.0.1")
	return &svcEnv{fixtureEnv: e, model: service.NewModel(service.Options{NodeAddrs: []netip.Addr{node}}),
		tables: service.NewTables(), node: node}
}

// applyYAML translates one Service with its EndpointSlices and programs it.
func applyYAML(t *testing.T, dp *Loader, m *service.Model, tables *service.Tables, y string) {
	t.Helper()
	objs, err := k8sobj.Decode([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	var svc *k8sobj.Service
	var eps []*k8sobj.EndpointSlice
	for _, o := range objs {
		if o.Service != nil {
			svc = o.Service
		}
		if o.EndpointSlice != nil {
			eps = append(eps, o.EndpointSlice)
		}
	}
	c, err := m.Set(svc, eps)
	if err != nil {
		t.Fatal(err)
	}
	if err := dp.ApplyServices(tables.Apply(c)); err != nil {
		t.Fatal(err)
	}
}

// apply translates YAML (one Service and its EndpointSlices) and programs it.
func (s *svcEnv) apply(t *testing.T, y string) {
	t.Helper()
	applyYAML(t, s.dp, s.model, s.tables, y)
}

func (s *svcEnv) frontend(t *testing.T, vip string, port uint16, proto service.Proto, scope service.Scope) *service.Frontend {
	t.Helper()
	f := s.model.Frontend(service.FrontendKey{Addr: netip.MustParseAddr(vip), Port: port, Proto: proto, Scope: scope})
	if f == nil {
		t.Fatalf("no frontend %s:%d", vip, port)
	}
	return f
}

// expectBackend is the backend the datapath must pick for a new flow (Maglev).
func expectBackend(t *testing.T, f *service.Frontend, client string, sport uint16) netip.AddrPort {
	t.Helper()
	h := lbFlowHash(netip.MustParseAddr(client), sport, f.Key.Addr, f.Key.Port, uint8(f.Key.Proto))
	b, ok := f.Select(h)
	if !ok {
		t.Fatalf("frontend %s has no backend", f.Key)
	}
	return netip.AddrPortFrom(b.Addr, b.Port)
}

type runResult struct {
	verdict   uint32
	out       []byte
	redirIf   int
	redirKind uint32
}

func (s *svcEnv) run(t *testing.T, prog *ebpf.Program, ifindex int, in []byte) runResult {
	t.Helper()
	if err := s.dp.pod.LastRedirect.Set(podRedirectTrace{}); err != nil {
		t.Fatal(err)
	}
	if err := s.dp.uplink.LastRedirect.Set(uplinkRedirectTrace{}); err != nil {
		t.Fatal(err)
	}
	opts := &ebpf.RunOptions{Data: bytes.Clone(in), DataOut: make([]byte, len(in)+256), Context: skbCtx{Ifindex: uint32(ifindex)}}
	ret, err := prog.Run(opts)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	var tr podRedirectTrace
	var utr uplinkRedirectTrace
	if err := s.dp.pod.LastRedirect.Get(&tr); err != nil {
		t.Fatal(err)
	}
	if err := s.dp.uplink.LastRedirect.Get(&utr); err != nil {
		t.Fatal(err)
	}
	if tr.Kind == 0 {
		tr = podRedirectTrace(utr)
	}
	out := opts.DataOut
	if len(out) >= 34 && binary.BigEndian.Uint16(out[12:]) == 0x0800 {
		if !testutil.IPv4HeaderValid(out) {
			t.Fatalf("IPv4 header checksum invalid: %x", out[14:34])
		}
		// Fragments: the caller checks the reassembled datagram (fragments).
		frag := binary.BigEndian.Uint16(out[20:])&0x3fff != 0
		if p := out[23]; (p == 6 || p == 17) && !frag && !testutil.L4ChecksumValid(out) {
			t.Fatalf("L4 checksum invalid: %x", out)
		}
	}
	return runResult{verdict: ret, out: out, redirIf: int(tr.Ifindex), redirKind: tr.Kind}
}

func (s *svcEnv) stats(t *testing.T) ServiceStats {
	t.Helper()
	st, err := s.dp.ServiceStats()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// fromPod1 builds a TCP segment pod 1 sends.
func (s *svcEnv) fromPod1(dst string, dport, sport uint16, flags uint8) []byte {
	return l4Frame(s.ep1.HostMAC, pod1MAC, "10.244.1.10", sport, dst, dport, 6, flags, 1000, 0, nil)
}

func svcYAML(name, vip string, port int, proto string, extra string, backends ...string) string {
	y := fmt.Sprintf(`
apiVersion: v1
kind: Service
metadata: {name: %s, namespace: fx}
spec:
  clusterIP: %s
  ports: [{name: p, port: %d, protocol: %s, targetPort: 8080%s}]
%s
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %s-a, namespace: fx, labels: {kubernetes.io/service-name: %s}}
addressType: IPv4
ports: [{name: p, port: 8080, protocol: %s}]
endpoints:
`, name, vip, port, proto, nodePortOf(extra), specExtra(extra), name, name, proto)
	for _, b := range backends {
		cond := "{ready: true}"
		addr := b
		if len(b) > 5 && b[len(b)-5:] == ":term" {
			addr = b[:len(b)-5]
			cond = "{ready: false, serving: true, terminating: true}"
		} else if len(b) > 9 && b[len(b)-9:] == ":notready" {
			addr = b[:len(b)-9]
			cond = "{ready: false}"
		}
		y += fmt.Sprintf("- addresses: [%s]\n  conditions: %s\n", addr, cond)
	}
	if len(backends) == 0 {
		y = y[:len(y)-1] + " []\n"
	}
	return y
}

func nodePortOf(extra string) string {
	var np int
	if _, err := fmt.Sscanf(extra, "nodePort=%d", &np); err == nil {
		return fmt.Sprintf(", nodePort: %d", np)
	}
	return ""
}

func specExtra(extra string) string {
	var secs int
	switch {
	case len(extra) > 9 && extra[:9] == "nodePort=":
		return "  type: NodePort"
	case extra != "":
		if _, err := fmt.Sscanf(extra, "affinity=%d", &secs); err == nil {
			return fmt.Sprintf("  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: %d}}", secs)
		}
	}
	return ""
}

// icmpErrFrame builds Ethernet + IPv4 + an ICMP error quoting quoted.
func icmpErrFrame(dst, src net.HardwareAddr, saddr, daddr string, typ, code byte, quoted []byte) []byte {
	b := testutil.EthIPv4(dst, src, saddr, daddr, 64, 1, 8+len(quoted))
	b[34], b[35] = typ, code
	copy(b[42:], quoted)
	binary.BigEndian.PutUint16(b[36:], ^icmpChecksum(b[34:]))
	return b
}

func icmpChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return uint16(sum)
}
