package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lanekit/lanekit/internal/nsexec"
)

// CPSResult is what the connection-rate client reports (as one JSON line).
type CPSResult struct {
	Conns   int64   `json:"conns"`
	Errors  int64   `json:"errors"`
	Seconds float64 `json:"seconds"`
	CPS     float64 `json:"cps"`
	// ErrorKinds counts the failed connections by cause.
	ErrorKinds map[string]int64 `json:"error_kinds,omitempty"`
	// ConnectP50Us and ConnectP99Us: how long connect() took for the
	// successful connections, in µs — the SYN out and the SYN-ACK back, the
	// first packet of a new flow each way (through a Service: the load
	// balancer's lookup, a new conntrack entry, the NAT).
	ConnectP50Us float64 `json:"connect_p50_us,omitempty"`
	ConnectP99Us float64 `json:"connect_p99_us,omitempty"`
}

// maxConnectSamples bounds the connect() times one run keeps (the first
// ones; a run opens some thousands per second).
const maxConnectSamples = 1 << 20

// errorKind names the cause of a failed connection, without addresses.
func errorKind(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return "no local port (EADDRNOTAVAIL)"
	case errors.Is(err, errNoClose):
		return "server did not close"
	case errors.As(err, &ne) && ne.Timeout():
		var op *net.OpError
		if errors.As(err, &op) {
			return op.Op + " timeout"
		}
		return "timeout"
	}
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+2:]
	}
	return msg
}

var errNoClose = errors.New("expected close from server")

// ServeCPS accepts connections on ln until ctx ends: each connection sends
// one byte, the server reads it and closes. It runs in the server netns.
func ServeCPS(ctx context.Context, ln net.Listener) error {
	return nsexec.Serve(ctx, ln, "cps server", func(c net.Conn) {
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		var b [1]byte
		_, _ = io.ReadFull(c, b[:])
	})
}

// RunCPS opens connections to addr for d with parallel workers: connect,
// write one byte, wait for the server's close, close. A connection counts
// only when the whole exchange succeeded.
func RunCPS(ctx context.Context, addr string, d time.Duration, parallel int) (CPSResult, error) {
	if parallel < 1 {
		parallel = 1
	}
	var conns, errs atomic.Int64
	var mu sync.Mutex
	kinds := map[string]int64{}
	var connects []time.Duration
	start := time.Now() // before the deadline: the run lasts at least d
	deadline := start.Add(d)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	dialer := net.Dialer{Timeout: time.Second}
	var wg sync.WaitGroup
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				took, err := oneConn(ctx, &dialer, addr)
				if err != nil {
					// Past the deadline a dial fails at once ("i/o
					// timeout") even before ctx reports it: not an error.
					if ctx.Err() == nil && time.Now().Before(deadline) {
						errs.Add(1)
						mu.Lock()
						kinds[errorKind(err)]++
						mu.Unlock()
					}
					continue
				}
				conns.Add(1)
				mu.Lock()
				if len(connects) < maxConnectSamples {
					connects = append(connects, took)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	res := CPSResult{Conns: conns.Load(), Errors: errs.Load(), Seconds: secs}
	if len(kinds) > 0 {
		res.ErrorKinds = kinds
	}
	if len(connects) > 0 {
		q := rrResult(connects) // nearest-rank percentiles
		res.ConnectP50Us, res.ConnectP99Us = q.P50us, q.P99us
	}
	if secs > 0 {
		res.CPS = float64(res.Conns) / secs
	}
	if res.Conns == 0 {
		return res, fmt.Errorf("cps to %s: no connection succeeded (%d errors)", addr, res.Errors)
	}
	return res, nil
}

// oneConn runs one exchange and returns how long its connect() took.
func oneConn(ctx context.Context, d *net.Dialer, addr string) (time.Duration, error) {
	start := time.Now()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	took := time.Since(start)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte{'x'}); err != nil {
		return took, err
	}
	var b [1]byte
	if _, err := c.Read(b[:]); !errors.Is(err, io.EOF) {
		return took, fmt.Errorf("%w, got %w", errNoClose, err)
	}
	return took, nil
}

// ParseCPS decodes the JSON line printed by the cps client subcommand.
func ParseCPS(data []byte) (CPSResult, error) {
	var r CPSResult
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("parse cps result %q: %w", data, err)
	}
	return r, nil
}
