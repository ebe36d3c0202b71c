// Command lk-bench is the benchmark harness's server side for the lanekit
// test guest: a small static binary (CGO_ENABLED=0, built by
// scripts/guest/build.sh into the initramfs) that runs the same Go code as
// `lanekit lab cps-server` and `lanekit lab cps-client`, where the full
// lanekit binary would be too large for the guest's RAM.
//
//	lk-bench cps-server --listen ADDR [--for DURATION]
//	lk-bench cps-client --addr ADDR [--duration DURATION] [--parallel N]
//	lk-bench udp-echo --listen ADDR [--for DURATION]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/lanekit/lanekit/pkg/bench"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "lk-bench:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: lk-bench cps-server|cps-client|udp-echo [flags]")
	}
	fs := flag.NewFlagSet("lk-bench "+args[0], flag.ContinueOnError)
	switch args[0] {
	case "cps-server":
		listen := fs.String("listen", "", "address to listen on")
		life := fs.Duration("for", time.Minute, "exit after this long")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			return fmt.Errorf("cps-server: %w", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), *life)
		defer cancel()
		return bench.ServeCPS(ctx, ln)
	case "cps-client":
		addr := fs.String("addr", "", "server address")
		d := fs.Duration("duration", 5*time.Second, "measurement time")
		par := fs.Int("parallel", 2, "concurrent connection loops")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		res, err := bench.RunCPS(context.Background(), *addr, *d, *par)
		if err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(res)
	case "udp-echo":
		listen := fs.String("listen", "", "UDP address to listen on")
		life := fs.Duration("for", 0, "exit after this long (0: never)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		pc, err := net.ListenPacket("udp", *listen)
		if err != nil {
			return fmt.Errorf("udp-echo: %w", err)
		}
		ctx := context.Background()
		if *life > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, *life)
			defer cancel()
		}
		return bench.ServeUDPEcho(ctx, pc)
	}
	return fmt.Errorf("unknown subcommand %q (cps-server, cps-client, udp-echo)", args[0])
}
