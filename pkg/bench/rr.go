package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"github.com/lanekit/lanekit/internal/nsexec"
)

// The TCP request/response tool of the IPv6 rows: sockperf 3.7 (Debian 12's)
// takes IPv4 addresses only, so rows whose server address is IPv6 measure
// RR with this ping-pong instead (one connection, TCP_NODELAY, a fixed-size
// message echoed back, every round trip timed). Rows are only compared with
// a reference measured by the same tool (host-raw-ipv6): Row.RRTool says
// which tool measured a row.

// RR tools (Row.RRTool).
const (
	RRToolSockperf = "sockperf"
	RRToolGo       = "lanekit-rr"
)

// rrMsgSize is the ping-pong message (sockperf's default message size).
const rrMsgSize = 14

// RRResult is what the RR client reports (one JSON line).
type RRResult struct {
	Trips int64   `json:"trips"`
	P50us float64 `json:"p50_us"`
	P99us float64 `json:"p99_us"`
}

// ServeRR echoes every rrMsgSize-byte message of every connection on ln
// until ctx ends.
func ServeRR(ctx context.Context, ln net.Listener) error {
	return nsexec.Serve(ctx, ln, "rr server", func(c net.Conn) {
		defer c.Close()
		var b [rrMsgSize]byte
		for {
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadFull(c, b[:]); err != nil {
				return
			}
			if _, err := c.Write(b[:]); err != nil {
				return
			}
		}
	})
}

// RunRR ping-pongs one message over one connection to addr for d and
// reports the round-trip percentiles.
func RunRR(ctx context.Context, addr string, d time.Duration) (RRResult, error) {
	dialer := net.Dialer{Timeout: 3 * time.Second}
	c, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return RRResult{}, fmt.Errorf("rr to %s: %w", addr, err)
	}
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	msg, in := make([]byte, rrMsgSize), make([]byte, rrMsgSize)
	copy(msg, "lanekit-rr....")
	rtts := make([]time.Duration, 0, 1<<16)
	end := time.Now().Add(d)
	for time.Now().Before(end) && ctx.Err() == nil {
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		t0 := time.Now()
		if _, err := c.Write(msg); err != nil {
			return RRResult{}, fmt.Errorf("rr to %s: %w", addr, err)
		}
		if _, err := io.ReadFull(c, in); err != nil {
			return RRResult{}, fmt.Errorf("rr to %s: %w", addr, err)
		}
		rtts = append(rtts, time.Since(t0))
	}
	if len(rtts) == 0 {
		return RRResult{}, fmt.Errorf("rr to %s: no round trip", addr)
	}
	return rrResult(rtts), nil
}

// rrResult summarizes round-trip times: nearest-rank percentiles.
func rrResult(rtts []time.Duration) RRResult {
	slices.Sort(rtts)
	pct := func(p float64) float64 {
		i := int(p*float64(len(rtts))+0.999999) - 1
		i = max(0, min(i, len(rtts)-1))
		return float64(rtts[i].Nanoseconds()) / 1e3
	}
	return RRResult{Trips: int64(len(rtts)), P50us: pct(0.50), P99us: pct(0.99)}
}

// ParseRR decodes the JSON line printed by the rr client subcommand.
func ParseRR(data []byte) (RRResult, error) {
	var r RRResult
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("parse rr result %q: %w", data, err)
	}
	if r.Trips <= 0 || r.P50us <= 0 || r.P99us < r.P50us {
		return r, fmt.Errorf("parse rr result %q: no round trips", data)
	}
	return r, nil
}

// rrTool is the RR tool of a path: sockperf, or this package's ping-pong for
// an IPv6 server address.
func rrTool(p Path) string {
	if pathFamily(p) == FamilyIPv6 {
		return RRToolGo
	}
	return RRToolSockperf
}

// runGoRR is runSockperf for the rows sockperf cannot measure (IPv6): the
// lanekit helper subcommands, with the same life, spinners and duration.
func runGoRR(ctx context.Context, o Options, p Path, s *samples) error {
	if o.Self == "" {
		return fmt.Errorf("rr: lanekit executable unknown")
	}
	if p.Guest != nil {
		return fmt.Errorf("rr over IPv6 to a guest: not offered (the guest image has no IPv6 RR server)")
	}
	life := o.Duration + 20*time.Second
	addr := hostPort(p.ServerIP, sockperfPort)
	srv, err := p.server(ctx, life, sockperfPort,
		[]string{o.Self, "lab", "rr-server", "--listen", hostPort(p.listenIP(), sockperfPort), "--for", life.String()}, nil)
	if err != nil {
		return err
	}
	defer srv.stop()
	if o.BusyCPUs {
		sp, err := startSpinners(ctx, o.Self, life)
		if err != nil {
			return err
		}
		defer sp.stop()
	}
	out, err := runIn(ctx, o.Duration+15*time.Second, p.ClientNS,
		o.Self, "lab", "rr-client", "--addr", addr, "--duration", o.Duration.String())
	if err != nil {
		return err
	}
	res, err := ParseRR(out)
	if err != nil {
		return err
	}
	s.p50[s.cur], s.p99[s.cur] = res.P50us, res.P99us
	return nil
}

// pathFamily is FamilyIPv6 for a path to an IPv6 server address, else "".
func pathFamily(p Path) string {
	if a := net.ParseIP(p.ServerIP); a != nil && a.To4() == nil {
		return FamilyIPv6
	}
	return ""
}

// rowReference is the row a table row's ratios are to: host-raw-ipv6 for
// an IPv6 row when measured, else ref.
func (r *Report) rowReference(row Row, ref string) string {
	if row.Family == FamilyIPv6 && r.row(RawPath6) != nil {
		return RawPath6
	}
	return ref
}
