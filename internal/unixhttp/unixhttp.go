// Package unixhttp reads HTTP endpoints served on unix sockets (the
// lanekit-vhost backends' --metrics-listen PATH).
package unixhttp

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/lanekit/lanekit/internal/peercred"
)

// MaxBody bounds what Get reads.
const MaxBody = 8 << 20

// Options narrow what Get accepts.
type Options struct {
	// MaxBody bounds the body read (0: MaxBody); a longer body is an error.
	MaxBody int64
	// PeerUID, when set, is the uid the server's process must run as
	// (SO_PEERCRED of the connection), checked before anything is sent.
	PeerUID *uint32
}

// Get returns the body of GET path on the HTTP server at unix socket sock;
// a status other than 200 is an error.
func Get(ctx context.Context, sock, path string) ([]byte, error) {
	return GetWith(ctx, sock, path, Options{})
}

// GetWith is Get with the server's credentials and the body size checked.
func GetWith(ctx context.Context, sock, path string, o Options) ([]byte, error) {
	limit := o.MaxBody
	if limit <= 0 {
		limit = MaxBody
	}
	c := http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, "unix", sock)
			if err != nil || o.PeerUID == nil {
				return conn, err
			}
			if err := checkPeer(conn.(*net.UnixConn), *o.PeerUID); err != nil {
				conn.Close()
				return nil, err
			}
			return conn, nil
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
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("get %s on %s: status %d: %v", path, sock, resp.StatusCode, err)
	}
	if int64(len(body)) > limit {
		return nil, fmt.Errorf("get %s on %s: body over %d bytes", path, sock, limit)
	}
	return body, nil
}

// checkPeer compares the uid of the process at the other end of c with uid.
func checkPeer(c *net.UnixConn, uid uint32) error {
	cred, err := peercred.Of(c)
	if err != nil {
		return err
	}
	if cred.Uid != uid {
		return fmt.Errorf("server runs as uid %d, want %d", cred.Uid, uid)
	}
	return nil
}
