package conncheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/lanekit/lanekit/internal/nsexec"
)

// ServerPort is the TCP echo port every test pod serves.
const ServerPort = 8080

// Serve echoes every connection on ln back until ctx ends (what the test
// pods run: `lanekit connectivity serve`).
func Serve(ctx context.Context, ln net.Listener) error {
	return nsexec.ServeEcho(ctx, ln, "conncheck echo")
}

// ProbeKind is what a probe asks of its target.
type ProbeKind string

const (
	// ProbeEcho connects, sends a token and wants it echoed back.
	ProbeEcho ProbeKind = "echo"
	// ProbeReach wants the target's kernel to answer: a connection or a
	// refusal (a RST came back), not a timeout or an unreachable.
	ProbeReach ProbeKind = "reach"
	// ProbeDNS resolves a name with the pod's resolver.
	ProbeDNS ProbeKind = "dns"
)

// Probe runs one probe from the caller's network namespace (`lanekit
// connectivity probe KIND TARGET`); the error says why it failed.
func Probe(ctx context.Context, kind ProbeKind, target string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch kind {
	case ProbeEcho, ProbeReach:
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", target)
		if err != nil {
			if kind == ProbeReach && errors.Is(err, syscall.ECONNREFUSED) {
				return "refused (the target answered)", nil
			}
			return "", err
		}
		defer c.Close()
		if kind == ProbeReach {
			return "connected", nil
		}
		if dl, ok := ctx.Deadline(); ok {
			_ = c.SetDeadline(dl)
		}
		token := []byte("lanekit-conncheck " + target)
		if _, err := c.Write(token); err != nil {
			return "", fmt.Errorf("write: %w", err)
		}
		got := make([]byte, len(token))
		if _, err := io.ReadFull(c, got); err != nil {
			return "", fmt.Errorf("read echo: %w", err)
		}
		if !bytes.Equal(got, token) {
			return "", fmt.Errorf("echo mismatch: %q", got)
		}
		return "echoed by " + c.RemoteAddr().String(), nil
	case ProbeDNS:
		addrs, err := net.DefaultResolver.LookupHost(ctx, target)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s resolves to %v", target, addrs), nil
	}
	return "", fmt.Errorf("unknown probe %q (echo, reach, dns)", kind)
}
