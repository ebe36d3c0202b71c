package k8s

import (
	"context"
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
