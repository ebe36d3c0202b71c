package unixhttp

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestGetWith: the server's uid (SO_PEERCRED) and the body size are
// checked; a plain Get reads what is served.
func TestGetWith(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "0123456789") })}
	go srv.Serve(ln)
	defer srv.Close()
	ctx := context.Background()
	me, other := uint32(os.Getuid()), uint32(os.Getuid()+1)
	if b, err := GetWith(ctx, sock, "/", Options{PeerUID: &me, MaxBody: 10}); err != nil || string(b) != "0123456789" {
		t.Fatalf("own uid: %q %v", b, err)
	}
	if _, err := GetWith(ctx, sock, "/", Options{PeerUID: &other}); err == nil || !strings.Contains(err.Error(), "server runs as uid") {
		t.Errorf("another uid: err %v", err)
	}
	if _, err := GetWith(ctx, sock, "/", Options{MaxBody: 9}); err == nil || !strings.Contains(err.Error(), "body over 9 bytes") {
		t.Errorf("over the bound: err %v", err)
	}
	if b, err := Get(ctx, sock, "/"); err != nil || len(b) != 10 {
		t.Errorf("get: %q %v", b, err)
	}
}
