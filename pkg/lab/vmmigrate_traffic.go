package lab

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lanekit/lanekit/pkg/bench"
	"github.com/lanekit/lanekit/pkg/netdev"
)

// pinger sends ICMP (or ICMPv6) echo requests from a pod netns at a fixed
// interval (raw socket) and notes when each reply arrives.
type pinger struct {
	ns    string
	conn  *net.IPConn
	dst   *net.IPAddr
	v6    bool
	id    uint16
	stopc chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	sent  int
	got   map[uint16]time.Time // seq -> reply time
	err   error
}

// PingStats is what one pinger saw.
type PingStats struct {
	From        string        `json:"from"` // the pod's netns
	Sent        int           `json:"sent"`
	Received    int           `json:"received"`
	Lost        int           `json:"lost"`
	MaxGap      time.Duration `json:"max_gap_ns"`    // longest time between two replies
	MaxGapStart time.Time     `json:"max_gap_start"` // the reply before it
}

func startPinger(ns, dst string, interval time.Duration, id uint16) (*pinger, error) {
	var conn *net.IPConn
	ip := net.ParseIP(dst)
	if ip == nil {
		return nil, fmt.Errorf("ping from %s: bad address %q", ns, dst)
	}
	v6 := ip.To4() == nil
	network, laddr := "ip4:icmp", "0.0.0.0"
	if v6 {
		network, laddr = "ip6:ipv6-icmp", "::" // the kernel fills in the ICMPv6 checksum
	}
	err := netdev.InNetns(netnsPath(ns), func() error {
		c, err := net.ListenPacket(network, laddr)
		if err != nil {
			return err
		}
		conn = c.(*net.IPConn)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ping from %s: %w", ns, err)
	}
	p := &pinger{ns: ns, conn: conn, dst: &net.IPAddr{IP: ip}, v6: v6, id: id, stopc: make(chan struct{}),
		got: map[uint16]time.Time{}}
	p.wg.Add(2)
	go p.send(interval)
	go p.receive()
	return p, nil
}

func icmpChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

func (p *pinger) send(interval time.Duration) {
	defer p.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for seq := uint16(0); ; seq++ {
		msg := make([]byte, 16)
		msg[0] = 8 // echo request
		if p.v6 {
			msg[0] = 128
		}
		binary.BigEndian.PutUint16(msg[4:], p.id)
		binary.BigEndian.PutUint16(msg[6:], seq)
		copy(msg[8:], "lanekit!")
		if !p.v6 {
			binary.BigEndian.PutUint16(msg[2:], icmpChecksum(msg))
		}
		if _, err := p.conn.WriteTo(msg, p.dst); err != nil {
			p.mu.Lock()
			p.err = err
			p.mu.Unlock()
		}
		p.mu.Lock()
		p.sent++
		p.mu.Unlock()
		select {
		case <-p.stopc:
			return
		case <-t.C:
		}
	}
}

func (p *pinger) receive() {
	defer p.wg.Done()
	buf := make([]byte, 1500)
	reply := byte(0)
	if p.v6 {
		reply = 129
	}
	for {
		n, from, err := p.conn.ReadFrom(buf)
		if err != nil {
			return // closed
		}
		now := time.Now()
		if n < 8 || buf[0] != reply || binary.BigEndian.Uint16(buf[4:]) != p.id || !from.(*net.IPAddr).IP.Equal(p.dst.IP) {
			continue
		}
		seq := binary.BigEndian.Uint16(buf[6:])
		p.mu.Lock()
		if _, dup := p.got[seq]; !dup {
			p.got[seq] = now
		}
		p.mu.Unlock()
	}
}

// stop ends the pinger after the last request's reply had a second to come.
func (p *pinger) stop() (PingStats, error) {
	select {
	case <-p.stopc:
	default:
		close(p.stopc)
	}
	time.Sleep(time.Second)
	p.conn.Close()
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	st := PingStats{From: p.ns, Sent: p.sent, Received: len(p.got)}
	st.Lost = st.Sent - st.Received
	times := make([]time.Time, 0, len(p.got))
	for _, t := range p.got {
		times = append(times, t)
	}
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	for i := 1; i < len(times); i++ {
		if g := times[i].Sub(times[i-1]); g > st.MaxGap {
			st.MaxGap, st.MaxGapStart = g, times[i-1]
		}
	}
	if p.err != nil && st.Received == 0 {
		return st, fmt.Errorf("ping from %s: %w", p.ns, p.err)
	}
	return st, nil
}

// tcpProbe holds one TCP connection from a pod to the guest's echo port
// (8080: greeting, then echo) and exchanges a line every interval.
type tcpProbe struct {
	conn     net.Conn
	stopc    chan struct{}
	done     chan struct{}
	n        int
	maxRTT   time.Duration
	err      error
	localStr string
}

// TCPStats is what the held connection saw.
type TCPStats struct {
	From      string        `json:"from"`
	Local     string        `json:"local"` // the client's address:port (one connection throughout)
	Exchanges int           `json:"exchanges"`
	MaxRTT    time.Duration `json:"max_rtt_ns"` // the longest exchange (the stall across the switch-over)
	Error     string        `json:"error,omitempty"`
}

// GuestEchoPort is the lab guest's TCP echo service (pkg/guest).
const GuestEchoPort = 8080

func startTCPProbe(ns, dst string, interval time.Duration) (*tcpProbe, error) {
	var conn net.Conn
	err := netdev.InNetns(netnsPath(ns), func() error {
		var err error
		conn, err = net.DialTimeout("tcp", net.JoinHostPort(dst, strconv.Itoa(GuestEchoPort)), 10*time.Second)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("tcp from %s to %s:%d: %w", ns, dst, GuestEchoPort, err)
	}
	r := bufio.NewReader(conn)
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	if hello, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(hello, "LK-HELLO") {
		conn.Close()
		return nil, fmt.Errorf("tcp from %s to %s: greeting %q: %v", ns, dst, hello, err)
	}
	p := &tcpProbe{conn: conn, stopc: make(chan struct{}), done: make(chan struct{}), localStr: conn.LocalAddr().String()}
	go func() {
		defer close(p.done)
		for i := 0; ; i++ {
			select {
			case <-p.stopc:
				return
			case <-time.After(interval):
			}
			line := fmt.Sprintf("lanekit-migrate %d\n", i)
			t0 := time.Now()
			conn.SetDeadline(t0.Add(10 * time.Second))
			if _, err := conn.Write([]byte(line)); err != nil {
				p.err = err
				return
			}
			got, err := r.ReadString('\n')
			if err != nil {
				p.err = err
				return
			}
			if got != line {
				p.err = fmt.Errorf("echo %q, sent %q", got, line)
				return
			}
			p.n++
			p.maxRTT = max(p.maxRTT, time.Since(t0))
		}
	}()
	return p, nil
}

func (p *tcpProbe) stop(ns string) TCPStats {
	close(p.stopc)
	<-p.done
	p.conn.Close()
	s := TCPStats{From: ns, Local: p.localStr, Exchanges: p.n, MaxRTT: p.maxRTT}
	if p.err != nil {
		s.Error = p.err.Error()
	}
	return s
}

// frameWatch polls a backend's count of frames delivered into the guest
// and notes when it first and last grew.
type frameWatch struct {
	first, last time.Time
	grew        int
	stopc, done chan struct{}
}

func watchFrames(ctx context.Context, sock string, every time.Duration) *frameWatch {
	w := &frameWatch{stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		var prev uint64
		seen := false
		for {
			rx, _, err := bench.BackendPackets(ctx, sock)
			now := time.Now()
			if err == nil {
				if seen && rx > prev {
					if w.first.IsZero() {
						w.first = now
					}
					w.last = now
					w.grew++
				}
				prev, seen = rx, true
			}
			select {
			case <-w.stopc:
				return
			case <-ctx.Done():
				return
			case <-time.After(every):
			}
		}
	}()
	return w
}

func (w *frameWatch) stop() {
	select {
	case <-w.stopc:
	default:
		close(w.stopc)
	}
	<-w.done
}
