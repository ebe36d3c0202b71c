package netdev

import (
	"fmt"

	"github.com/containernetworking/plugins/pkg/ns"
)

// InNetns runs fn on a locked OS thread inside the network namespace at path
// (a namespace file such as /run/netns/NAME or /proc/PID/ns/net).
func InNetns(path string, fn func() error) error {
	n, err := ns.GetNS(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer n.Close()
	return n.Do(func(ns.NetNS) error { return fn() })
}
