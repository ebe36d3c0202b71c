package bench

import (
	"context"
	"fmt"
	"net"
)

// ServeUDPEcho sends every datagram that arrives on pc back to its sender,
// unchanged, until ctx ends: the lanekit test guest's UDP echo (lk-bench
// udp-echo), which the live-migration tests stream sequenced datagrams
// through. A datagram that cannot be answered (its sender unreachable) is
// dropped; the server goes on.
func ServeUDPEcho(ctx context.Context, pc net.PacketConn) error {
	stop := context.AfterFunc(ctx, func() { _ = pc.Close() })
	defer stop()
	buf := make([]byte, 64<<10)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("udp echo: %w", err)
		}
		_, _ = pc.WriteTo(buf[:n], from)
	}
}
