package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// servePprof serves Go's runtime profiles (heap, goroutine, CPU, ...) under
// /debug/pprof/ on addr until ctx ends, as `cilium-agent --pprof` does: off
// by default, and on its own listener (not the metrics one, which Prometheus
// may reach) because a profile shows the agent's memory and stacks. It
// returns the bound address (addr may name port 0).
func servePprof(ctx context.Context, addr string, log *slog.Logger) (net.Addr, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--pprof-address: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("pprof", "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	log.Info("serving Go profiles", "addr", lis.Addr().String(), "path", "/debug/pprof/")
	return lis.Addr(), nil
}
