package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/lanekit/lanekit/internal/nsexec"
)

// EchoPort is the TCP echo port `lab check` uses in every target netns.
const EchoPort = 7777

// UDPEchoPort is the lanekit test guest's UDP echo (lk-bench udp-echo, from
// scripts/guest/init): the live-migration tests' sequenced datagram stream.
const UDPEchoPort = 7779

// ServeEcho echoes every connection on ln back until ctx ends.
func ServeEcho(ctx context.Context, ln net.Listener) error {
	return nsexec.ServeEcho(ctx, ln, "echo")
}

// DialResult is one target of a `lab tcp-dial` run.
type DialResult struct {
	Addr  string `json:"addr"`
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// EchoDial connects to every addr concurrently, sends a token and expects
// it back within timeout.
func EchoDial(ctx context.Context, addrs []string, timeout time.Duration) []DialResult {
	out := make([]DialResult, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = DialResult{Addr: a, OK: true}
			if err := echoOnce(ctx, a, timeout); err != nil {
				out[i] = DialResult{Addr: a, Error: err.Error()}
			}
		}()
	}
	wg.Wait()
	return out
}

func echoOnce(ctx context.Context, addr string, timeout time.Duration) error {
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	token := []byte("lanekit-lab-check " + addr)
	if _, err := c.Write(token); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	got := make([]byte, len(token))
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("read echo: %w", err)
	}
	if !bytes.Equal(got, token) {
		return fmt.Errorf("echo mismatch: %q", got)
	}
	return nil
}

// ParseDialResults decodes the JSON printed by `lab tcp-dial`.
func ParseDialResults(data []byte) ([]DialResult, error) {
	var rs []DialResult
	if err := json.Unmarshal(data, &rs); err != nil {
		return nil, fmt.Errorf("parse tcp-dial output %q: %w", data, err)
	}
	return rs, nil
}
