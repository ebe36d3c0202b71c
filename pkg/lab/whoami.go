package lab

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/lanekit/lanekit/internal/nsexec"
)

// ServeWhoami answers every connection on ln with the address it was accepted
// on (the backend pod's IP:port after the datapath's DNAT), so a client of a
// service sees which backend served it.
func ServeWhoami(ctx context.Context, ln net.Listener) error {
	return nsexec.Serve(ctx, ln, "whoami", func(c net.Conn) {
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.WriteString(c, c.LocalAddr().String()+"\n")
	})
}

// AskWhoami opens count connections to addr, one after the other (each from
// a new source port), and counts the answers by backend. Failed connections
// count under "error: ...".
func AskWhoami(ctx context.Context, addr string, count int, timeout time.Duration) map[string]int {
	out := map[string]int{}
	for range count {
		ans, err := askOnce(ctx, addr, timeout)
		if err != nil {
			out["error: "+err.Error()]++
			continue
		}
		out[ans]++
	}
	return out
}

func askOnce(ctx context.Context, addr string, timeout time.Duration) (string, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	b, err := io.ReadAll(io.LimitReader(c, 64))
	if err != nil {
		return "", fmt.Errorf("read: %w", err)
	}
	if len(b) == 0 || b[len(b)-1] != '\n' {
		return "", fmt.Errorf("short answer %q", b)
	}
	return string(b[:len(b)-1]), nil
}
