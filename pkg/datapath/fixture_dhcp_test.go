package datapath

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/lanekit/lanekit/internal/testutil"
)

// dhcpMsg is a guest's DHCP client message as the fixtures vary it.
type dhcpMsg struct {
	ethSrc, chaddr  net.HardwareAddr
	src, dst        string // IPv4 source and destination
	sport, dport    uint16 // 0: 68, 67
	typ             layers.DHCPMsgType
	ciaddr, giaddr  string
	broadcast       bool
	opts            []layers.DHCPOption
	noCookie        bool
	truncate, padTo int    // cut the frame by truncate bytes; pad the DHCP payload to padTo (0: 300, as clients do)
	rawOpts         []byte // the options area as given (no END added)
}

// frame serialises m with gopacket (Ethernet + IPv4 + UDP + DHCPv4).
func (m dhcpMsg) frame(t *testing.T) []byte {
	t.Helper()
	if m.sport == 0 {
		m.sport = 68
	}
	if m.dport == 0 {
		m.dport = 67
	}
	d := &layers.DHCPv4{Operation: layers.DHCPOpRequest, HardwareType: layers.LinkTypeEthernet,
		Xid: 0x1234abcd, ClientHWAddr: m.chaddr, ClientIP: net.IPv4zero, YourClientIP: net.IPv4zero,
		NextServerIP: net.IPv4zero, RelayAgentIP: net.IPv4zero}
	if m.ciaddr != "" {
		d.ClientIP = net.ParseIP(m.ciaddr)
	}
	if m.giaddr != "" {
		d.RelayAgentIP = net.ParseIP(m.giaddr)
	}
	if m.broadcast {
		d.Flags = 0x8000
	}
	if m.typ != 0 {
		d.Options = append(d.Options, layers.NewDHCPOption(layers.DHCPOptMessageType, []byte{byte(m.typ)}))
	}
	d.Options = append(d.Options, m.opts...)
	eth := &layers.Ethernet{SrcMAC: m.ethSrc, DstMAC: layers.EthernetBroadcast, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: net.ParseIP(m.src), DstIP: net.ParseIP(m.dst)}
	udp := &layers.UDP{SrcPort: layers.UDPPort(m.sport), DstPort: layers.UDPPort(m.dport)}
	if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
		t.Fatal(err)
	}
	var dhcp []byte
	if m.rawOpts != nil {
		b := gopacket.NewSerializeBuffer()
		d.Options = nil
		if err := d.SerializeTo(b, gopacket.SerializeOptions{FixLengths: true}); err != nil {
			t.Fatal(err)
		}
		dhcp = append(b.Bytes()[:240], m.rawOpts...)
	} else {
		b := gopacket.NewSerializeBuffer()
		if err := d.SerializeTo(b, gopacket.SerializeOptions{FixLengths: true}); err != nil {
			t.Fatal(err)
		}
		dhcp = b.Bytes()
	}
	if m.noCookie {
		copy(dhcp[236:240], []byte{0, 0, 0, 0})
	}
	pad := m.padTo
	if pad == 0 {
		pad = 300
	}
	if len(dhcp) < pad {
		dhcp = append(dhcp, make([]byte, pad-len(dhcp))...)
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, ip, udp, gopacket.Payload(dhcp)); err != nil {
		t.Fatal(err)
	}
	out := buf.Bytes()
	return out[:len(out)-m.truncate]
}

// runDHCP runs frame through from_pod on ifindex: verdict, output and the
// last redirect.
func runDHCP(t *testing.T, e *fixtureEnv, ifindex int, in []byte) (uint32, []byte, podRedirectTrace) {
	t.Helper()
	if err := e.dp.pod.LastRedirect.Set(podRedirectTrace{}); err != nil {
		t.Fatal(err)
	}
	opts := &ebpf.RunOptions{Data: bytes.Clone(in), DataOut: make([]byte, len(in)+512), Context: skbCtx{Ifindex: uint32(ifindex)}}
	ret, err := e.dp.pod.FromPod.Run(opts)
	if err != nil {
		t.Fatalf("run from_pod: %v", err)
	}
	var tr podRedirectTrace
	if err := e.dp.pod.LastRedirect.Get(&tr); err != nil {
		t.Fatal(err)
	}
	return ret, opts.DataOut, tr
}

// dhcpReply decodes a reply from_pod built and checks what every reply
// must be: from the gateway's MAC and address, port 67 to 68, valid IPv4 and
// UDP checksums, a BOOTREPLY of dhcpReplyLen bytes echoing the client's xid and
// hardware address, names zeroed.
func dhcpReply(t *testing.T, e *fixtureEnv, out []byte) (*layers.Ethernet, *layers.IPv4, *layers.DHCPv4) {
	t.Helper()
	pkt := gopacket.NewPacket(out, layers.LayerTypeEthernet, gopacket.Default)
	eth, _ := pkt.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	ip, _ := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	udp, _ := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
	d, _ := pkt.Layer(layers.LayerTypeDHCPv4).(*layers.DHCPv4)
	if eth == nil || ip == nil || udp == nil || d == nil {
		t.Fatalf("reply does not decode as Ethernet/IPv4/UDP/DHCPv4: %v\n%x", pkt.ErrorLayer(), out)
	}
	if !bytes.Equal(eth.SrcMAC, e.ep3.HostMAC) || !ip.SrcIP.Equal(DefaultGatewayIP.AsSlice()) {
		t.Errorf("reply from %s %s, want the gateway %s %s", eth.SrcMAC, ip.SrcIP, e.ep3.HostMAC, DefaultGatewayIP)
	}
	if udp.SrcPort != 67 || udp.DstPort != 68 || len(udp.Payload) != dhcpReplyLen {
		t.Errorf("reply UDP %d -> %d with %d bytes, want 67 -> 68 with %d", udp.SrcPort, udp.DstPort, len(udp.Payload), dhcpReplyLen)
	}
	if !testutil.IPv4HeaderValid(out) || !testutil.L4ChecksumValid(out) || udp.Checksum == 0 {
		t.Errorf("reply checksums invalid (IPv4 %v, UDP %#04x)", testutil.IPv4HeaderValid(out), udp.Checksum)
	}
	if d.Operation != layers.DHCPOpReply || d.Xid != 0x1234abcd || !bytes.Equal(d.ClientHWAddr, vm3MAC) {
		t.Errorf("reply op %v xid %#x chaddr %s", d.Operation, d.Xid, d.ClientHWAddr)
	}
	if !bytes.Equal(udp.Payload[44:236], make([]byte, 192)) {
		t.Errorf("reply sname/file not zero")
	}
	return eth, ip, d
}

// dhcpReplyLen is every reply's DHCP message: 240 bytes to the options,
// 43 of fixed options, the endpoint's DHCPExtraMax and END — at most 548,
// what every client takes (a 576-byte datagram).
const dhcpReplyLen = 240 + 43 + DHCPExtraMax + 1

// dropsDuring runs f and returns how each drop counter of endpoint id grew.
func dropsDuring(t *testing.T, e *fixtureEnv, id uint32, f func()) map[DropReason]uint64 {
	t.Helper()
	before, err := e.dp.Counters(id)
	if err != nil {
		t.Fatal(err)
	}
	f()
	after, err := e.dp.Counters(id)
	if err != nil {
		t.Fatal(err)
	}
	grew := map[DropReason]uint64{}
	for r, n := range after.Drops {
		if d := n - before.Drops[r]; d != 0 {
			grew[r] = d
		}
	}
	return grew
}

func dhcpOpt(d *layers.DHCPv4, typ layers.DHCPOpt) []byte {
	for _, o := range d.Options {
		if o.Type == typ {
			return o.Data
		}
	}
	return nil
}

// TestDHCPServerFixture: from_pod answers a VM endpoint's DISCOVER and
// REQUEST (lib/dhcp.h) with its own address and the gateway's routes, and
// refuses what a guest could forge.
func TestDHCPServerFixture(t *testing.T) {
	e := newFixtureEnv(t)
	vmIP, gw := "10.244.1.12", DefaultGatewayIP.String()
	gw4 := DefaultGatewayIP.AsSlice()
	discover := dhcpMsg{ethSrc: vm3MAC, chaddr: vm3MAC, src: "0.0.0.0", dst: "255.255.255.255", typ: layers.DHCPMsgTypeDiscover}
	request := func(m dhcpMsg, req, server string) dhcpMsg {
		m.typ = layers.DHCPMsgTypeRequest
		if req != "" {
			m.opts = append(m.opts, layers.NewDHCPOption(layers.DHCPOptRequestIP, net.ParseIP(req).To4()))
		}
		if server != "" {
			m.opts = append(m.opts, layers.NewDHCPOption(layers.DHCPOptServerID, net.ParseIP(server).To4()))
		}
		return m
	}
	extras := false // the endpoint has DHCPOptions (the subtest that sets them)
	lease := func(t *testing.T, d *layers.DHCPv4, want layers.DHCPMsgType) {
		t.Helper()
		if got := dhcpOpt(d, layers.DHCPOptMessageType); len(got) != 1 || layers.DHCPMsgType(got[0]) != want {
			t.Fatalf("message type %v, want %v", got, want)
		}
		if !d.YourClientIP.Equal(net.ParseIP(vmIP)) {
			t.Errorf("yiaddr %s, want the VM's %s", d.YourClientIP, vmIP)
		}
		for _, c := range []struct {
			opt  layers.DHCPOpt
			want []byte
		}{
			{layers.DHCPOptServerID, gw4},
			{layers.DHCPOptLeaseTime, []byte{0xff, 0xff, 0xff, 0xff}},
			{layers.DHCPOptSubnetMask, []byte{255, 255, 255, 255}},
			{layers.DHCPOptRouter, gw4},
			// gateway/32 on-link, then the default route via it (RFC 3442)
			{layers.DHCPOptClasslessStaticRoute, append(append(append([]byte{32}, gw4...), 0, 0, 0, 0, 0), gw4...)},
		} {
			if got := dhcpOpt(d, c.opt); !bytes.Equal(got, c.want) {
				t.Errorf("option %v = %v, want %v", c.opt, got, c.want)
			}
		}
		if got := dhcpOpt(d, layers.DHCPOptDNS); got != nil && !extras {
			t.Errorf("name servers %v offered with none configured", got)
		}
	}
	sentTo := func(t *testing.T, eth *layers.Ethernet, ip *layers.IPv4, mac net.HardwareAddr, addr net.IP) {
		t.Helper()
		if !bytes.Equal(eth.DstMAC, mac) || !ip.DstIP.Equal(addr) {
			t.Errorf("reply to %s %s, want %s %s", eth.DstMAC, ip.DstIP, mac, addr)
		}
	}
	answered := func(t *testing.T, in []byte) ([]byte, podRedirectTrace) {
		t.Helper()
		v, out, tr := runDHCP(t, e, ifH3(e), in)
		if v != tcActRedirect || int(tr.Ifindex) != ifH3(e) || tr.Kind != 1 {
			t.Fatalf("verdict %d redirect %+v, want a redirect back through the VM's device %d", v, tr, ifH3(e))
		}
		return out, tr
	}

	t.Run("DISCOVER: OFFER of the VM's address, unicast to its MAC", func(t *testing.T) {
		e.enter(t)
		out, _ := answered(t, discover.frame(t))
		eth, ip, d := dhcpReply(t, e, out)
		lease(t, d, layers.DHCPMsgTypeOffer)
		sentTo(t, eth, ip, vm3MAC, net.ParseIP(vmIP))
	})
	t.Run("DISCOVER with the broadcast flag: broadcast OFFER", func(t *testing.T) {
		e.enter(t)
		m := discover
		m.broadcast = true
		out, _ := answered(t, m.frame(t))
		eth, ip, d := dhcpReply(t, e, out)
		lease(t, d, layers.DHCPMsgTypeOffer)
		sentTo(t, eth, ip, layers.EthernetBroadcast, net.IPv4bcast)
	})
	t.Run("the endpoint's DHCPOptions: MTU, name servers, domain and search list on OFFER and ACK, not on NAK", func(t *testing.T) {
		e.enter(t)
		withOpts := e.ep3
		withOpts.DHCP = DHCPOptions{DNS: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("10.96.0.11")},
			Search: []string{"vms.svc.cluster.local", "svc.cluster.local", "cluster.local"}, MTU: 1450}
		if err := e.dp.UpsertEndpoint(withOpts); err != nil {
			t.Fatal(err)
		}
		extras = true
		defer func() {
			extras = false
			if err := e.dp.UpsertEndpoint(e.ep3); err != nil {
				t.Fatal(err)
			}
		}()
		search := []byte("\x03vms\x03svc\x07cluster\x05local\x00\x03svc\x07cluster\x05local\x00\x07cluster\x05local\x00")
		for _, m := range []dhcpMsg{discover, request(discover, vmIP, gw)} {
			out, _ := answered(t, m.frame(t))
			_, _, d := dhcpReply(t, e, out)
			lease(t, d, map[layers.DHCPMsgType]layers.DHCPMsgType{layers.DHCPMsgTypeDiscover: layers.DHCPMsgTypeOffer,
				layers.DHCPMsgTypeRequest: layers.DHCPMsgTypeAck}[m.typ])
			for _, c := range []struct {
				opt  layers.DHCPOpt
				want []byte
			}{
				{layers.DHCPOptInterfaceMTU, []byte{0x05, 0xaa}},
				{layers.DHCPOptDNS, []byte{10, 96, 0, 10, 10, 96, 0, 11}},
				{layers.DHCPOptDomainName, []byte("vms.svc.cluster.local")},
				{layers.DHCPOptDomainSearch, search},
			} {
				if got := dhcpOpt(d, c.opt); !bytes.Equal(got, c.want) {
					t.Errorf("%v: option %v = %q, want %q", m.typ, c.opt, got, c.want)
				}
			}
			// After the fixed options, exactly these, then END and zeros.
			want := append([]byte{26, 2, 0x05, 0xaa, 6, 8, 10, 96, 0, 10, 10, 96, 0, 11, 15, 21}, "vms.svc.cluster.local"...)
			want = append(append(append(want, 119, byte(len(search))), search...), 255)
			want = append(want, make([]byte, DHCPExtraMax+1-len(want))...)
			if got := d.Contents[240+43:]; !bytes.Equal(got, want) {
				t.Errorf("%v: options after the fixed ones\n%x, want\n%x", m.typ, got, want)
			}
		}
		out, _ := answered(t, request(discover, "10.244.1.11", "").frame(t))
		_, _, d := dhcpReply(t, e, out)
		if dhcpOpt(d, layers.DHCPOptDNS) != nil || dhcpOpt(d, layers.DHCPOptDomainSearch) != nil {
			t.Errorf("NAK carries the endpoint's options: %v", d.Options)
		}
	})
	t.Run("short DISCOVER (no padding): the reply grows to BOOTP's 300 bytes", func(t *testing.T) {
		e.enter(t)
		m := discover
		m.padTo = 1
		out, _ := answered(t, m.frame(t))
		_, _, d := dhcpReply(t, e, out)
		lease(t, d, layers.DHCPMsgTypeOffer)
	})
	t.Run("REQUEST (selecting) for its address from this server: ACK", func(t *testing.T) {
		e.enter(t)
		out, _ := answered(t, request(discover, vmIP, gw).frame(t))
		_, _, d := dhcpReply(t, e, out)
		lease(t, d, layers.DHCPMsgTypeAck)
	})
	t.Run("REQUEST (renewing, unicast to the gateway from its address): ACK", func(t *testing.T) {
		e.enter(t)
		m := discover
		m.src, m.dst, m.ciaddr = vmIP, gw, vmIP
		out, _ := answered(t, request(m, "", "").frame(t))
		eth, ip, d := dhcpReply(t, e, out)
		lease(t, d, layers.DHCPMsgTypeAck)
		sentTo(t, eth, ip, vm3MAC, net.ParseIP(vmIP))
	})
	t.Run("REQUEST for another address: broadcast NAK without a lease", func(t *testing.T) {
		e.enter(t)
		out, _ := answered(t, request(discover, "10.244.1.11", "").frame(t))
		eth, ip, d := dhcpReply(t, e, out)
		if got := dhcpOpt(d, layers.DHCPOptMessageType); len(got) != 1 || layers.DHCPMsgType(got[0]) != layers.DHCPMsgTypeNak {
			t.Fatalf("message type %v, want NAK", got)
		}
		if !d.YourClientIP.Equal(net.IPv4zero) || dhcpOpt(d, layers.DHCPOptLeaseTime) != nil || dhcpOpt(d, layers.DHCPOptRouter) != nil {
			t.Errorf("NAK carries yiaddr %s / a lease / routes: %v", d.YourClientIP, d.Options)
		}
		sentTo(t, eth, ip, layers.EthernetBroadcast, net.IPv4bcast)
	})

	// What a guest can forge: each is dropped and counted against the VM.
	pads := make([]byte, 0, 64)
	for range 50 {
		pads = append(pads, 0)
	}
	for _, c := range []struct {
		name   string
		ep     func(*fixtureEnv) int
		epID   uint32
		m      dhcpMsg
		reason DropReason
	}{
		{"REQUEST naming another server", ifH3, 3, request(discover, vmIP, "10.244.1.1"), DropDHCP},
		{"RELEASE", ifH3, 3, dhcpMsg{ethSrc: vm3MAC, chaddr: vm3MAC, src: vmIP, dst: gw, ciaddr: vmIP, typ: layers.DHCPMsgTypeRelease}, DropDHCP},
		{"INFORM", ifH3, 3, dhcpMsg{ethSrc: vm3MAC, chaddr: vm3MAC, src: vmIP, dst: "255.255.255.255", ciaddr: vmIP, typ: layers.DHCPMsgTypeInform}, DropDHCP},
		{"no message type", ifH3, 3, dhcpMsg{ethSrc: vm3MAC, chaddr: vm3MAC, src: "0.0.0.0", dst: "255.255.255.255"}, DropDHCP},
		{"the type past the walk's " + "option limit (50 pads first)", ifH3, 3,
			dhcpMsg{ethSrc: vm3MAC, chaddr: vm3MAC, src: "0.0.0.0", dst: "255.255.255.255", rawOpts: append(pads, 53, 1, 1, 255)}, DropDHCP},
		{"another client's hardware address (chaddr)", ifH3, 3,
			dhcpMsg{ethSrc: vm3MAC, chaddr: pod1MAC, src: "0.0.0.0", dst: "255.255.255.255", typ: layers.DHCPMsgTypeDiscover}, DropSpoofedMAC},
		{"another source MAC", ifH3, 3,
			dhcpMsg{ethSrc: pod1MAC, chaddr: vm3MAC, src: "0.0.0.0", dst: "255.255.255.255", typ: layers.DHCPMsgTypeDiscover}, DropSpoofedMAC},
		{"another endpoint's source address", ifH3, 3,
			dhcpMsg{ethSrc: vm3MAC, chaddr: vm3MAC, src: "10.244.1.11", dst: "255.255.255.255", typ: layers.DHCPMsgTypeDiscover}, DropSpoofedIP},
		{"an option running past the payload", ifH3, 3,
			dhcpMsg{ethSrc: vm3MAC, chaddr: vm3MAC, src: "0.0.0.0", dst: "255.255.255.255", rawOpts: []byte{53, 1, 1, 12, 200, 'x'}, padTo: 1}, DropMalformed},
		{"no DHCP cookie", ifH3, 3,
			dhcpMsg{ethSrc: vm3MAC, chaddr: vm3MAC, src: "0.0.0.0", dst: "255.255.255.255", typ: layers.DHCPMsgTypeDiscover, noCookie: true}, DropMalformed},
		{"through a relay agent (giaddr)", ifH3, 3,
			dhcpMsg{ethSrc: vm3MAC, chaddr: vm3MAC, src: "0.0.0.0", dst: "255.255.255.255", typ: layers.DHCPMsgTypeDiscover, giaddr: "10.244.1.1"}, DropMalformed},
		{"UDP length past the frame", ifH3, 3,
			dhcpMsg{ethSrc: vm3MAC, chaddr: vm3MAC, src: "0.0.0.0", dst: "255.255.255.255", typ: layers.DHCPMsgTypeDiscover, truncate: 20}, DropMalformed},
		// Pods get no DHCP: a pod's DISCOVER is the anti-spoofing drop it was.
		{"a pod's DISCOVER", ifH1, 1,
			dhcpMsg{ethSrc: pod1MAC, chaddr: pod1MAC, src: "0.0.0.0", dst: "255.255.255.255", typ: layers.DHCPMsgTypeDiscover}, DropSpoofedIP},
	} {
		t.Run(c.name+": dropped", func(t *testing.T) {
			e.enter(t)
			in := c.m.frame(t)
			if c.m.truncate > 0 {
				// a frame cut short with its IPv4 length still whole is
				// malformed to parse_eth already: keep the IPv4 header
				// consistent and lie only in the UDP length
				binary.BigEndian.PutUint16(in[16:], uint16(len(in)-14))
				binary.BigEndian.PutUint16(in[24:], 0)
				binary.BigEndian.PutUint16(in[24:], testutil.IPv4Checksum(in[14:34]))
			}
			var v uint32
			drops := dropsDuring(t, e, c.epID, func() { v, _, _ = runDHCP(t, e, c.ep(e), in) })
			if d := drops[c.reason]; v != tcActShot || d != 1 {
				t.Errorf("verdict %d, %s drops +%d; want a drop counted as %s", v, c.reason, d, c.reason)
			}
		})
	}

	t.Run("a VM without an IPv4 address: dropped, no lease of 0.0.0.0", func(t *testing.T) {
		e.enter(t)
		v6only := e.ep3
		v6only.IP, v6only.IP6 = netip.Addr{}, netip.MustParseAddr("fd00:10:244:1::12")
		if err := e.dp.UpsertEndpoint(v6only); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := e.dp.UpsertEndpoint(e.ep3); err != nil {
				t.Fatal(err)
			}
		}()
		var v uint32
		drops := dropsDuring(t, e, 3, func() { v, _, _ = runDHCP(t, e, ifH3(e), discover.frame(t)) })
		if d := drops[DropDHCP]; v != tcActShot || d != 1 {
			t.Errorf("verdict %d, dhcp-unanswered drops +%d; want a counted drop", v, d)
		}
	})
	t.Run("DHCP to a server elsewhere (unicast): not answered here, routed as any packet", func(t *testing.T) {
		e.enter(t)
		m := discover
		m.src, m.dst, m.ciaddr = vmIP, "10.244.2.5", vmIP
		v, out, tr := runDHCP(t, e, ifH3(e), request(m, "", "").frame(t))
		if v == tcActRedirect && int(tr.Ifindex) == ifH3(e) {
			t.Fatalf("answered by the VM's own link: %x", out)
		}
	})
}

// TestDHCPServerRandomOptions feeds from_pod DHCP messages from the VM whose
// options area is random (TLVs of random codes and lengths, message types,
// requested addresses, pads, a last option running past the end, random
// bytes): each must end as dhcpModel says, a counted drop or a well-formed
// reply of that type leasing the VM its own address, never anything else.
func TestDHCPServerRandomOptions(t *testing.T) {
	e := newFixtureEnv(t)
	e.enter(t)
	rng := rand.New(rand.NewPCG(37, 1))
	var answered, dropped int
	for i := range 400 {
		// options as TLVs of random codes and lengths, a message type
		// among them half the time, sometimes a requested address, some
		// with pads, some with a last option running past the end or
		// plain random bytes
		var opts []byte
		for range rng.IntN(10) {
			switch rng.IntN(8) {
			case 0:
				opts = append(opts, 53, 1, byte(1+rng.IntN(8)))
			case 1:
				opts = append(opts, 50, 4, 10, 244, 1, byte(10+rng.IntN(4)))
			case 2:
				opts = append(opts, 0)
			default:
				n := rng.IntN(9)
				opts = append(opts, byte(1+rng.IntN(254)), byte(n))
				for range n {
					opts = append(opts, byte(rng.IntN(256)))
				}
			}
		}
		switch rng.IntN(4) {
		case 0:
			opts = append(opts, byte(1+rng.IntN(254)), byte(10+rng.IntN(200))) // runs past the end
		case 1:
			for range rng.IntN(40) {
				opts = append(opts, byte(rng.IntN(256)))
			}
		default:
			opts = append(opts, 255)
		}
		m := dhcpMsg{ethSrc: vm3MAC, chaddr: vm3MAC, src: "0.0.0.0", dst: "255.255.255.255", rawOpts: opts, padTo: 1}
		var v uint32
		var out []byte
		var tr podRedirectTrace
		var drops uint64
		for _, n := range dropsDuring(t, e, 3, func() { v, out, tr = runDHCP(t, e, ifH3(e), m.frame(t)) }) {
			drops += n
		}
		want := dhcpModel(opts)
		switch {
		case v == tcActShot && drops == 1 && want == 0:
			dropped++
		case v == tcActRedirect && int(tr.Ifindex) == ifH3(e) && drops == 0 && want != 0:
			_, _, d := dhcpReply(t, e, out)
			typ := dhcpOpt(d, layers.DHCPOptMessageType)
			if len(typ) != 1 || layers.DHCPMsgType(typ[0]) != want ||
				(want != layers.DHCPMsgTypeNak && !d.YourClientIP.Equal(net.ParseIP("10.244.1.12"))) {
				t.Fatalf("message %d (options %x): reply type %v yiaddr %s, want %v", i, opts, typ, d.YourClientIP, want)
			}
			answered++
		default:
			t.Fatalf("message %d (options %x): verdict %d, redirect %+v, %d drops counted; want %v (0: a drop)", i, opts, v, tr, drops, want)
		}
	}
	t.Logf("400 random option areas: %d answered, %d dropped and counted", answered, dropped)
	if answered == 0 || dropped == 0 {
		t.Errorf("answered %d, dropped %d: the generator should reach both", answered, dropped)
	}
}

// dhcpModel is what lib/dhcp.h must answer a DISCOVER-shaped message (from
// 0.0.0.0, no ciaddr) whose options area is opts, ending the payload: the
// reply type, or 0 for a drop. The same walk (at most 48 options, END or the
// payload's end stops it, a length past the end is malformed, the last of
// each option counts), written independently.
func dhcpModel(opts []byte) layers.DHCPMsgType {
	var typ byte
	var requested, server []byte
	off := 0
	for range 48 {
		if off >= len(opts) || opts[off] == 255 {
			break
		}
		if opts[off] == 0 {
			off++
			continue
		}
		if off+2 > len(opts) || off+2+int(opts[off+1]) > len(opts) {
			return 0
		}
		code, val := opts[off], opts[off+2:off+2+int(opts[off+1])]
		switch {
		case code == 53 && len(val) == 1:
			typ = val[0]
		case code == 50 && len(val) == 4:
			requested = val
		case code == 54 && len(val) == 4:
			server = val
		}
		off += 2 + len(val)
	}
	switch typ {
	case 1:
		return layers.DHCPMsgTypeOffer
	case 3:
		if server != nil && !bytes.Equal(server, DefaultGatewayIP.AsSlice()) {
			return 0
		}
		if bytes.Equal(requested, []byte{10, 244, 1, 12}) {
			return layers.DHCPMsgTypeAck
		}
		return layers.DHCPMsgTypeNak
	}
	return 0
}
