package lab

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// netnsHTTPClient is an HTTP client whose connections are made inside the
// network namespace at nsPath (e.g. /run/netns/lk-node1): lab addresses only
// exist there, and from the host's namespace the same address leaves by the
// host's default route to whatever answers outside (a lab must never talk to
// it). The socket is created on a thread switched into the namespace and
// keeps it after the thread switches back.
func netnsHTTPClient(nsPath string, timeout time.Duration) *http.Client {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("dial %s in %s: %w", addr, nsPath, err)
		}
		return c, nil
	}
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}}
}
