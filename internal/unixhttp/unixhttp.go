// Package unixhttp reads HTTP endpoints served on unix sockets (the
// lanekit-vhost backends' --metrics-listen PATH).
package unixhttp

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
)

// MaxBody bounds what Get reads.
const MaxBody = 8 << 20

// Get returns the body of GET path on the HTTP server at unix socket sock;
// a status other than 200 is an error.
func Get(ctx context.Context, sock, path string) ([]byte, error) {
	c := http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://unix"+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("get %s on %s: %w", path, sock, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxBody))
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("get %s on %s: status %d: %v", path, sock, resp.StatusCode, err)
	}
	return body, nil
}
