//go:build !nolab

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"time"

	"github.com/spf13/cobra"

	"github.com/lanekit/lanekit/pkg/bench"
	"github.com/lanekit/lanekit/pkg/lab"
)

// Hidden helpers the lab runs inside its namespaces (`ip netns exec NS
// lanekit lab ...`): the TCP echo of `lab check` and the connection-rate
// pair of `lab bench`. Each is bounded in time.
func init() {
	labCmd.AddCommand(tcpEchoCmd(), tcpDialCmd(), cpsServerCmd(), cpsClientCmd(), cpuSpinCmd(), whoamiCmd(), askCmd(), firstAnswerCmd())
}

func whoamiCmd() *cobra.Command {
	var listen string
	var life time.Duration
	cmd := &cobra.Command{
		Use:    "tcp-whoami",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("tcp-whoami: %w", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), life)
			defer cancel()
			return lab.ServeWhoami(ctx, ln)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "0.0.0.0:8080", "address to listen on")
	cmd.Flags().DurationVar(&life, "for", time.Minute, "exit after this long")
	return cmd
}

func askCmd() *cobra.Command {
	var count int
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:    "tcp-ask ADDR",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return json.NewEncoder(cmd.OutOrStdout()).Encode(lab.AskWhoami(context.Background(), args[0], count, timeout))
		},
	}
	cmd.Flags().IntVar(&count, "count", 30, "connections to open")
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "per-connection timeout")
	return cmd
}

func tcpEchoCmd() *cobra.Command {
	var listen string
	var life time.Duration
	cmd := &cobra.Command{
		Use:    "tcp-echo",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("tcp-echo: %w", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), life)
			defer cancel()
			return lab.ServeEcho(ctx, ln)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", fmt.Sprintf("0.0.0.0:%d", lab.EchoPort), "address to listen on")
	cmd.Flags().DurationVar(&life, "for", time.Minute, "exit after this long")
	return cmd
}

func tcpDialCmd() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:    "tcp-dial ADDR...",
		Hidden: true,
		Args:   cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res := lab.EchoDial(context.Background(), args, timeout)
			return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "per-target timeout")
	return cmd
}

func cpsServerCmd() *cobra.Command { return benchServerCmd("cps-server", bench.ServeCPS) }

// benchServerCmd is a hidden lab command (use) that listens on --listen and
// serves a bench peer (serve) for --for at most.
func benchServerCmd(use string, serve func(context.Context, net.Listener) error) *cobra.Command {
	var listen string
	var life time.Duration
	cmd := &cobra.Command{
		Use:    use,
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("%s: %w", use, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), life)
			defer cancel()
			return serve(ctx, ln)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "", "address to listen on")
	cmd.Flags().DurationVar(&life, "for", time.Minute, "exit after this long")
	return cmd
}

func cpsClientCmd() *cobra.Command {
	var addr string
	var d time.Duration
	var parallel int
	cmd := &cobra.Command{
		Use:    "cps-client",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := bench.RunCPS(context.Background(), addr, d, parallel)
			if err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "", "server address")
	cmd.Flags().DurationVar(&d, "duration", 5*time.Second, "how long to open connections")
	cmd.Flags().IntVar(&parallel, "parallel", 2, "concurrent connection loops")
	return cmd
}

// cpuSpinCmd keeps one CPU busy at SCHED_IDLE (started by `lab bench
// --busy-cpus` under chrt --idle and taskset).
func cpuSpinCmd() *cobra.Command {
	var life time.Duration
	cmd := &cobra.Command{
		Use:    "cpu-spin",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return bench.Spin(life)
		},
	}
	cmd.Flags().DurationVar(&life, "for", time.Minute, "exit after this long")
	return cmd
}

// firstAnswerCmd dials --addr until it is answered (accepted or refused by
// the host behind it) and prints when, as JSON (lab bench --cni --services
// times a new Service with it, in the client pod's netns).
func firstAnswerCmd() *cobra.Command {
	var addr string
	var limit time.Duration
	cmd := &cobra.Command{
		Use:    "first-answer",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out, err := lab.FirstAnswerJSON(context.Background(), addr, limit)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), out)
			return err
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "", "address to dial (host:port)")
	cmd.Flags().DurationVar(&limit, "for", time.Minute, "give up after this long")
	return cmd
}
