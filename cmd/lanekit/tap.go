package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/lanekit/lanekit/pkg/rss"
)

var tapCmd = &cobra.Command{
	Use:   "tap",
	Short: "Multiqueue taps of VMs: receive steering (TUNSETSTEERINGEBPF)",
}

var tapOpts struct {
	tap, netns, key, table, types, pinDir string
	queues, defaultQueue                  int
}

func tapPinDir() string {
	if tapOpts.pinDir != "" {
		return tapOpts.pinDir
	}
	return rss.PinDir(tapOpts.netns, tapOpts.tap)
}

// removeEmptyNetnsDir removes the default pin layout's netns directory when
// its last tap is gone (os.Remove fails on a non-empty directory).
func removeEmptyNetnsDir() {
	if tapOpts.pinDir == "" {
		_ = os.Remove(filepath.Dir(rss.PinDir(tapOpts.netns, tapOpts.tap)))
	}
}

var tapSteerCmd = &cobra.Command{
	Use:   "steer --tap NAME [--netns NS] [--key HEX] (--queues N | --table q,q,...) [--types LIST] [--default-queue N]",
	Short: "Steer a multiqueue tap's packets to queues by Toeplitz RSS (needs root)",
	Long: `Loads bpf/tun_steer.c, writes key, indirection table and hash types into its
maps (pinned under /sys/fs/bpf/lanekit/tap/<netns>/<tap>/, QEMU rss.bpf.c
layout, so the agent or QEMU can update them), and sets it as the tap's
steering program: attach a queue to the tap (TUNSETIFF IFF_MULTI_QUEUE),
TUNSETSTEERINGEBPF, close the queue. The program belongs to the device and
stays after this command exits, until it is replaced, removed with
'lanekit tap unsteer', or the tap is destroyed. Running steer again on the
same tap rewrites the pinned maps and re-sets the program.`,
	Args: cobra.NoArgs,
	RunE: func(cmd *cobra.Command, _ []string) error {
		o := tapOpts
		key, err := rss.KeyOrDefault(o.key)
		if err != nil {
			return err
		}
		types, err := rss.ParseHashTypes(o.types)
		if err != nil {
			return err
		}
		var table []uint16
		switch {
		case o.table != "" && o.queues != 0:
			return fmt.Errorf("give --queues or --table, not both")
		case o.table != "":
			for _, f := range strings.Split(o.table, ",") {
				q, err := strconv.ParseUint(strings.TrimSpace(f), 10, 16)
				if err != nil {
					return fmt.Errorf("--table entry %q: %w", f, err)
				}
				table = append(table, uint16(q))
			}
		case o.queues > 0 && o.queues <= 256:
			table = rss.RoundRobin(o.queues, rss.TableSize)
		default:
			return errors.New("give --queues N (1..256) or --table q,q,… (a comma-separated queue list)")
		}
		if o.defaultQueue < 0 || o.defaultQueue > 0xffff {
			return fmt.Errorf("--default-queue %d out of range", o.defaultQueue)
		}
		cfg := rss.Config{Redirect: true, HashTypes: types, Table: table, DefaultQueue: uint16(o.defaultQueue)}
		if err := cfg.Validate(); err != nil {
			return err
		}
		pin := tapPinDir()
		_, statErr := os.Stat(pin)
		fresh := os.IsNotExist(statErr)
		s, err := rss.LoadSteering(pin)
		if err != nil {
			return err
		}
		defer s.Close()
		err = s.Update(key, cfg)
		if err == nil {
			err = s.AttachTap(o.netns, o.tap)
		}
		if err != nil {
			if fresh { // do not leave maps of a tap we never steered
				_ = os.RemoveAll(pin)
				removeEmptyNetnsDir()
			}
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "tap %s: steering %s with a %d-entry table, default queue %d; maps in %s\n",
			o.tap, types, len(table), cfg.DefaultQueue, tapPinDir())
		return nil
	},
}

var tapUnsteerCmd = &cobra.Command{
	Use:   "unsteer --tap NAME [--netns NS]",
	Short: "Remove a tap's steering program and its pinned maps (needs root)",
	Args:  cobra.NoArgs,
	RunE: func(cmd *cobra.Command, _ []string) error {
		if err := rss.DetachTap(tapOpts.netns, tapOpts.tap); err != nil {
			return err
		}
		if err := os.RemoveAll(tapPinDir()); err != nil {
			return fmt.Errorf("remove pinned maps: %w", err)
		}
		removeEmptyNetnsDir()
		fmt.Fprintf(cmd.OutOrStdout(), "tap %s: steering program removed\n", tapOpts.tap)
		return nil
	},
}

var tapShowCmd = &cobra.Command{
	Use:   "show --tap NAME [--netns NS]",
	Short: "Print a tap's steering maps and counters (needs root)",
	Args:  cobra.NoArgs,
	RunE: func(cmd *cobra.Command, _ []string) error {
		s, err := rss.OpenPinnedSteering(tapPinDir())
		if err != nil {
			return err
		}
		defer s.Close()
		key, cfg, err := s.Read()
		if err != nil {
			return err
		}
		hashed, dflt, err := s.Stats()
		if err != nil {
			return err
		}
		out := cmd.OutOrStdout()
		fmt.Fprintf(out, "maps:          %s\n", tapPinDir())
		fmt.Fprintf(out, "redirect:      %v\n", cfg.Redirect)
		fmt.Fprintf(out, "hash types:    %s\n", cfg.HashTypes)
		fmt.Fprintf(out, "key:           %s\n", key)
		fmt.Fprintf(out, "default queue: %d\n", cfg.DefaultQueue)
		fmt.Fprintf(out, "table (%d):    %v\n", len(cfg.Table), cfg.Table)
		fmt.Fprintf(out, "packets:       %d hashed, %d to the default queue\n", hashed, dflt)
		return nil
	},
}

func init() {
	for _, c := range []*cobra.Command{tapSteerCmd, tapUnsteerCmd, tapShowCmd} {
		c.Flags().StringVar(&tapOpts.tap, "tap", "", "tap device name")
		c.Flags().StringVar(&tapOpts.netns, "netns", "", "network namespace of the tap (name under /run/netns or a path; default: this one)")
		c.Flags().StringVar(&tapOpts.pinDir, "pin-dir", "", "map pin directory (default /sys/fs/bpf/lanekit/tap/<netns>/<tap>)")
		_ = c.MarkFlagRequired("tap")
		tapCmd.AddCommand(c)
	}
	f := tapSteerCmd.Flags()
	f.StringVar(&tapOpts.key, "key", "", "Toeplitz key, 40 bytes as hex (default: the Microsoft RSS verification key)")
	f.IntVar(&tapOpts.queues, "queues", 0, "queues to spread over: a 128-entry round-robin table")
	f.StringVar(&tapOpts.table, "table", "", "explicit indirection table, comma-separated queue indexes (1..128 entries)")
	f.StringVar(&tapOpts.types, "types", "all", "hash types: ipv4,tcpv4,udpv4,ipv6,tcpv6,udpv6 or all")
	f.IntVar(&tapOpts.defaultQueue, "default-queue", 0, "queue of packets without a hash")
	rootCmd.AddCommand(tapCmd)
}
