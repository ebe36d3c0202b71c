package bench

import (
	"context"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestFirstAnswer: a listener answers at once, a closed port (refused)
// too, and an address that never answers runs into the limit.
func TestFirstAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if _, err := FirstAnswer(context.Background(), ln.Addr().String(), time.Second); err != nil {
		t.Errorf("listener: %v", err)
	}
	closed := ln.Addr().String()
	ln.Close()
	if _, err := FirstAnswer(context.Background(), closed, time.Second); err != nil {
		t.Errorf("refused port: %v", err)
	}
	// No route yet (what a pod sees before its datapath has the VIP).
	unreachable := func(context.Context, string, string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ENETUNREACH)}
	}
	start := time.Now()
	if _, err := firstAnswer(context.Background(), "10.96.128.1:80", 300*time.Millisecond, unreachable); err == nil {
		t.Error("an unanswered address answered")
	} else if time.Since(start) < 250*time.Millisecond {
		t.Errorf("gave up after %s, before the limit: %v", time.Since(start), err)
	}
}
