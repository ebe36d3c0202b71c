package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestPprofAddress: --pprof-address serves the heap profile (what `go tool
// pprof` reads) and stops with the agent; without the flag nothing listens
// (run does not call servePprof).
func TestPprofAddress(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	addr, err := servePprof(ctx, "127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr.String() + "/debug/pprof/heap?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "# HeapInuse = ") {
		t.Fatalf("heap profile: %d %.200q", resp.StatusCode, body)
	}
	cancel()
	for range 50 { // Close is asynchronous
		if _, err = http.Get("http://" + addr.String() + "/debug/pprof/"); err != nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Error("the pprof listener still answers after the agent stopped")
}
