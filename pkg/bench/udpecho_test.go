package bench

import (
	"context"
	"net"
	"testing"
	"time"
)

func TestServeUDPEcho(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Skipf("no loopback UDP: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeUDPEcho(ctx, pc) }()
	// Two senders, each answered with its own datagrams, in order.
	for _, payload := range []string{"1", "2 a longer one"} {
		c, err := net.Dial("udp", pc.LocalAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			msg := payload + string(rune('a'+i))
			if _, err := c.Write([]byte(msg)); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 100)
			n, err := c.Read(buf)
			if err != nil || string(buf[:n]) != msg {
				t.Fatalf("echo of %q: %q, %v", msg, buf[:n], err)
			}
		}
		c.Close()
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ServeUDPEcho after its context ended: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ServeUDPEcho did not return when its context ended")
	}
}
