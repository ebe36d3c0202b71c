package testutil

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// InNetns runs f on a locked OS thread inside the namespace h and returns
// f's error. The thread goes back to Go's pool only when switching back to
// its original namespace worked; otherwise it stays locked and dies with its
// goroutine, so no other goroutine ever runs in h by accident.
func InNetns(h netns.NsHandle, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(h); err != nil {
			errc <- fmt.Errorf("enter netns: %w", err)
			return
		}
		err = f()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// InNetnsPath is InNetns for a namespace file such as /run/netns/NAME.
func InNetnsPath(path string, f func() error) error {
	h, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer h.Close()
	return InNetns(h, f)
}
