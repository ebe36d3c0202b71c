package k8s

import (
	"context"
	"net"
	"time"
)

// retryRoutes is how soon a failed route sync is retried without a change.
const retryRoutes = 5 * time.Second

// afterChan is closed after d, or never if ctx ends first.
func afterChan(ctx context.Context, d time.Duration) <-chan struct{} {
	c := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
		case <-time.After(d):
			close(c)
		}
	}()
	return c
}

// equalMAC compares two MAC addresses in any notation.
func equalMAC(a, b string) bool {
	ma, err1 := net.ParseMAC(a)
	mb, err2 := net.ParseMAC(b)
	return err1 == nil && err2 == nil && ma.String() == mb.String()
}
