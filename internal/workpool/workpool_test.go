package workpool

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
)

// Every index runs once, on no more goroutines than asked.
func TestRunCallsEveryIndexOnce(t *testing.T) {
	const n, w = 1000, 4
	var calls [n]atomic.Int32
	var running, most atomic.Int32
	err := Run(context.Background(), n, w, func(_ context.Context, i int) error {
		r := running.Add(1)
		for m := most.Load(); r > m && !most.CompareAndSwap(m, r); m = most.Load() {
		}
		calls[i].Add(1)
		running.Add(-1)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range calls {
		if c := calls[i].Load(); c != 1 {
			t.Fatalf("index %d ran %d times", i, c)
		}
	}
	if most.Load() > w {
		t.Fatalf("%d calls at once, want at most %d", most.Load(), w)
	}
}

// The first error is returned, the others see a cancelled context, and no
// new index starts after it.
func TestRunStopsAtTheFirstError(t *testing.T) {
	boom := errors.New("boom")
	var started atomic.Int32
	err := Run(context.Background(), 1000, 1, func(ctx context.Context, i int) error {
		started.Add(1)
		if i == 10 {
			return boom
		}
		return ctx.Err()
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Run = %v, want the first error", err)
	}
	if s := started.Load(); s != 11 {
		t.Fatalf("%d calls started, want 11 (none after the error)", s)
	}
}
