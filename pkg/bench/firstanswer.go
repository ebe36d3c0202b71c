package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// FirstAnswer dials addr (TCP) every millisecond until a connection is
// answered by a host behind it, and returns when: either accepted, or
// refused (a reset from the backend, which has no listener on that port:
// only a datapath that translated the address can deliver the SYN there).
// Unreachable, timed-out and filtered attempts are retried until limit.
func FirstAnswer(ctx context.Context, addr string, limit time.Duration) (time.Time, error) {
	d := net.Dialer{Timeout: 50 * time.Millisecond}
	return firstAnswer(ctx, addr, limit, d.DialContext)
}

func firstAnswer(ctx context.Context, addr string, limit time.Duration, dial func(context.Context, string, string) (net.Conn, error)) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last error
	for {
		c, err := dial(ctx, "tcp", addr)
		now := time.Now()
		if err == nil {
			c.Close()
			return now, nil
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			return now, nil
		}
		last = err
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("%s: no answer within %s (last: %v)", addr, limit, last)
		case <-time.After(time.Millisecond):
		}
	}
}
