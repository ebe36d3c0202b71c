package lbipam

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Responder answers ARP requests (IPv4) and neighbour solicitations (IPv6)
// for a set of addresses on one link, from packet sockets, with the link's
// MAC; addresses added to the set are announced with a gratuitous ARP or
// an unsolicited neighbour advertisement. The kernel does not answer for
// them itself: they are no local addresses, and the BPF Service path
// translates the traffic that then arrives.
type Responder struct {
	ifindex int
	mac     net.HardwareAddr
	ll      netip.Addr // the link's IPv6 link-local address, the NAs' source
	arp, nd int        // packet sockets (ETH_P_ARP; ETH_P_IPV6 filtered to NS)
	log     *slog.Logger

	mu    sync.Mutex
	addrs map[netip.Addr]bool
	wg    sync.WaitGroup
	stop  chan struct{}
}

const (
	ethARP  = 0x0806
	ethIPv6 = 0x86dd
	// readTimeout bounds how long a reader blocks, so Close ends it.
	readTimeout = 200 * time.Millisecond
	// announceRepeat: gratuitous ARPs / unsolicited NAs sent on takeover.
	announceRepeat = 3
)

// OpenResponder opens the packet sockets on link ifname in the network
// namespace at nsPath ("" = the caller's) and starts answering (for no
// address until Set).
func OpenResponder(nsPath, ifname string, log *slog.Logger) (*Responder, error) {
	if log == nil {
		log = slog.Default()
	}
	r := &Responder{arp: -1, nd: -1, log: log, addrs: map[netip.Addr]bool{}, stop: make(chan struct{})}
	err := inNetns(nsPath, func() error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return fmt.Errorf("link %s: %w", ifname, err)
		}
		r.ifindex, r.mac = l.Attrs().Index, l.Attrs().HardwareAddr
		if len(r.mac) != 6 {
			return fmt.Errorf("link %s has no Ethernet address: L2 announcements need one", ifname)
		}
		if as, err := netlink.AddrList(l, netlink.FAMILY_V6); err == nil {
			for _, a := range as {
				if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.IsLinkLocalUnicast() {
					r.ll = ip
				}
			}
		}
		if r.arp, err = packetSocket(r.ifindex, ethARP, nil); err != nil {
			return fmt.Errorf("ARP socket on %s: %w", ifname, err)
		}
		if r.nd, err = packetSocket(r.ifindex, ethIPv6, nsFilter); err != nil {
			return fmt.Errorf("IPv6 NDP socket on %s: %w", ifname, err)
		}
		return nil
	})
	if err != nil {
		r.closeFDs()
		return nil, err
	}
	r.wg.Add(2)
	go r.serve(r.arp, r.answerARP)
	go r.serve(r.nd, r.answerNS)
	return r, nil
}

// nsFilter passes ICMPv6 neighbour solicitations (no extension headers
// before ICMPv6, as RFC 4861 senders write them) and nothing else, so the
// agent never sees the uplink's other IPv6 traffic.
var nsFilter = []bpf.Instruction{
	bpf.LoadAbsolute{Off: 14 + 6, Size: 1}, // next header
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.IPPROTO_ICMPV6, SkipTrue: 3},
	bpf.LoadAbsolute{Off: 14 + 40, Size: 1}, // ICMPv6 type
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 135, SkipTrue: 1},
	bpf.RetConstant{Val: 0xffff},
	bpf.RetConstant{Val: 0},
}

func packetSocket(ifindex int, proto uint16, filter []bpf.Instruction) (int, error) {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(proto)))
	if err != nil {
		return -1, err
	}
	if filter != nil {
		raw, err := bpf.Assemble(filter)
		if err != nil {
			unix.Close(fd)
			return -1, err
		}
		prog := make([]unix.SockFilter, len(raw))
		for i, ins := range raw {
			prog[i] = unix.SockFilter{Code: ins.Op, Jt: ins.Jt, Jf: ins.Jf, K: ins.K}
		}
		if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
			&unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("attach filter: %w", err)
		}
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(proto), Ifindex: ifindex}); err != nil {
		unix.Close(fd)
		return -1, err
	}
	tv := unix.NsecToTimeval(readTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// Set replaces the addresses answered for and announces the new ones.
func (r *Responder) Set(addrs []netip.Addr) error {
	r.mu.Lock()
	var added []netip.Addr
	next := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		next[a] = true
		if !r.addrs[a] {
			added = append(added, a)
		}
	}
	var errs []error
	for a := range r.addrs {
		if !next[a] && a.Is6() {
			errs = append(errs, r.membership(a, unix.PACKET_DROP_MEMBERSHIP))
		}
	}
	for _, a := range added {
		if a.Is6() {
			errs = append(errs, r.membership(a, unix.PACKET_ADD_MEMBERSHIP))
		}
	}
	r.addrs = next
	r.mu.Unlock()
	if len(added) > 0 {
		r.log.Info("l2: announcing", "addrs", added)
	}
	for range announceRepeat {
		for _, a := range added {
			errs = append(errs, r.announce(a))
		}
	}
	return errors.Join(errs...)
}

// Addrs are the addresses answered for now.
func (r *Responder) Addrs() []netip.Addr {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]netip.Addr, 0, len(r.addrs))
	for a := range r.addrs {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

// membership has the link accept a's solicited-node multicast group
// (33:33:ff + the address's last 24 bits), where solicitations for it go.
func (r *Responder) membership(a netip.Addr, op int) error {
	b := a.As16()
	mr := unix.PacketMreq{Ifindex: int32(r.ifindex), Type: unix.PACKET_MR_MULTICAST, Alen: 6,
		Address: [8]uint8{0x33, 0x33, 0xff, b[13], b[14], b[15]}}
	if err := unix.SetsockoptPacketMreq(r.nd, unix.SOL_PACKET, op, &mr); err != nil {
		return fmt.Errorf("solicited-node group of %s: %w", a, err)
	}
	return nil
}

func (r *Responder) has(a netip.Addr) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.addrs[a]
}

// Close stops answering and closes the sockets.
func (r *Responder) Close() error {
	close(r.stop)
	r.wg.Wait()
	r.closeFDs()
	return nil
}

func (r *Responder) closeFDs() {
	for _, fd := range []int{r.arp, r.nd} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

func (r *Responder) serve(fd int, answer func([]byte) []byte) {
	defer r.wg.Done()
	buf := make([]byte, 1600)
	for {
		select {
		case <-r.stop:
			return
		default:
		}
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			r.log.Warn("l2: read", "err", err)
			time.Sleep(readTimeout)
			continue
		}
		if out := answer(buf[:n]); out != nil {
			if err := r.send(fd, out); err != nil {
				r.log.Warn("l2: reply", "err", err)
			}
		}
	}
}

func (r *Responder) send(fd int, frame []byte) error {
	var dst [8]byte
	copy(dst[:], frame[:6])
	return unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{
		Protocol: htons(binary.BigEndian.Uint16(frame[12:14])), Ifindex: r.ifindex, Halen: 6, Addr: dst})
}

// announce sends one gratuitous ARP (a request for a from a, to broadcast)
// or unsolicited NA (override, to all nodes) for a.
func (r *Responder) announce(a netip.Addr) error {
	if a.Is4() {
		return r.send(r.arp, arpFrame(1, r.mac, a, broadcast, net.HardwareAddr(make([]byte, 6)), a))
	}
	return r.send(r.nd, r.naFrame(net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}, netip.MustParseAddr("ff02::1"), a, false))
}

var broadcast = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// answerARP turns a request for one of the addresses into its reply.
func (r *Responder) answerARP(f []byte) []byte {
	const off = 14
	if len(f) < off+28 || binary.BigEndian.Uint16(f[12:14]) != ethARP {
		return nil
	}
	p := f[off:]
	if binary.BigEndian.Uint16(p[0:2]) != 1 || binary.BigEndian.Uint16(p[2:4]) != 0x0800 || p[4] != 6 || p[5] != 4 ||
		binary.BigEndian.Uint16(p[6:8]) != 1 {
		return nil
	}
	tip, _ := netip.AddrFromSlice(p[24:28])
	if !r.has(tip) {
		return nil
	}
	sha := net.HardwareAddr(slices.Clone(p[8:14]))
	sip, _ := netip.AddrFromSlice(p[14:18])
	return arpFrame(2, r.mac, tip, sha, sha, sip)
}

func arpFrame(op uint16, sha net.HardwareAddr, sip netip.Addr, ethDst, tha net.HardwareAddr, tip netip.Addr) []byte {
	f := make([]byte, 14+28)
	copy(f[0:6], ethDst)
	copy(f[6:12], sha)
	binary.BigEndian.PutUint16(f[12:14], ethARP)
	p := f[14:]
	binary.BigEndian.PutUint16(p[0:2], 1)
	binary.BigEndian.PutUint16(p[2:4], 0x0800)
	p[4], p[5] = 6, 4
	binary.BigEndian.PutUint16(p[6:8], op)
	copy(p[8:14], sha)
	s4, t4 := sip.As4(), tip.As4()
	copy(p[14:18], s4[:])
	copy(p[18:24], tha)
	copy(p[24:28], t4[:])
	return f
}

// answerNS answers a neighbour solicitation for one of the addresses
// (RFC 4861 7.1.1 checks: hop limit 255, code 0, not a multicast target)
// with a solicited, override advertisement to the solicitor (all nodes
// when it solicits from ::, as duplicate address detection does).
func (r *Responder) answerNS(f []byte) []byte {
	const ip, icmp = 14, 14 + 40
	if len(f) < icmp+24 || binary.BigEndian.Uint16(f[12:14]) != ethIPv6 || f[ip+6] != unix.IPPROTO_ICMPV6 ||
		f[ip+7] != 255 || f[icmp] != 135 || f[icmp+1] != 0 {
		return nil
	}
	target, _ := netip.AddrFromSlice(f[icmp+8 : icmp+24])
	if target.IsMulticast() || !r.has(target) {
		return nil
	}
	src, _ := netip.AddrFromSlice(f[ip+8 : ip+24])
	if src.IsUnspecified() {
		return r.naFrame(net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}, netip.MustParseAddr("ff02::1"), target, false)
	}
	return r.naFrame(net.HardwareAddr(slices.Clone(f[6:12])), src, target, true)
}

// naFrame is a neighbour advertisement for target with this link's MAC
// (override set; solicited for a reply) from the link-local address, or
// from the target itself when the link has none.
func (r *Responder) naFrame(ethDst net.HardwareAddr, dst, target netip.Addr, solicited bool) []byte {
	src := r.ll
	if !src.IsValid() {
		src = target
	}
	const ip, icmp, plen = 14, 14 + 40, 32
	f := make([]byte, icmp+plen)
	copy(f[0:6], ethDst)
	copy(f[6:12], r.mac)
	binary.BigEndian.PutUint16(f[12:14], ethIPv6)
	f[ip] = 0x60
	binary.BigEndian.PutUint16(f[ip+4:ip+6], plen)
	f[ip+6], f[ip+7] = unix.IPPROTO_ICMPV6, 255
	s, d, t := src.As16(), dst.As16(), target.As16()
	copy(f[ip+8:ip+24], s[:])
	copy(f[ip+24:ip+40], d[:])
	m := f[icmp:]
	m[0] = 136
	flags := byte(0x20) // override
	if solicited {
		flags |= 0x40
	}
	m[4] = flags
	copy(m[8:24], t[:])
	m[24], m[25] = 2, 1 // target link-layer address option, 8 bytes
	copy(m[26:32], r.mac)
	binary.BigEndian.PutUint16(m[2:4], icmp6Checksum(s, d, m))
	return f
}

func icmp6Checksum(src, dst [16]byte, msg []byte) uint16 {
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	add(src[:])
	add(dst[:])
	var l [8]byte
	binary.BigEndian.PutUint32(l[0:4], uint32(len(msg)))
	l[7] = unix.IPPROTO_ICMPV6
	add(l[:])
	add(msg)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// inNetns runs f on a locked OS thread in the namespace at path ("": here).
// The thread returns to Go's pool only once back in its own namespace.
func inNetns(path string, f func() error) error {
	if path == "" {
		return f()
	}
	h, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer h.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(h); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", path, err)
			return
		}
		err = f()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}
