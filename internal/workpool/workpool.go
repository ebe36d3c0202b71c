// Package workpool runs indexed work on a bounded number of goroutines.
package workpool

import (
	"context"
	"sync"
	"sync/atomic"
)

// Run calls f for every index in [0, n) on up to w goroutines. The first
// error cancels the context the others get and stops handing out indexes;
// Run returns it (or ctx's cause) once every call has returned.
func Run(ctx context.Context, n, w int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range w {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}
