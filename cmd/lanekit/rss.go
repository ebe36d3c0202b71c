package main

import (
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"

	"github.com/spf13/cobra"

	"github.com/lanekit/lanekit/pkg/rss"
)

var rssCmd = &cobra.Command{
	Use:   "rss",
	Short: "Receive-side scaling: the Toeplitz hash lanekit's BPF programs compute",
}

var rssHashOpts rssHashOptions

type rssHashOptions struct {
	key, typ, src, dst, frame string
	sport, dport              uint16
	verbose                   bool
}

var rssHashCmd = &cobra.Command{
	Use:   "hash --type TYPE (--src IP --dst IP [--sport N --dport N] | --frame HEX) [--key HEX]",
	Short: "Print the RSS hash of a flow or a frame, computed by the BPF code (needs root: BPF_PROG_TEST_RUN)",
	Long: `With --src/--dst: builds a frame of the flow, runs lanekit's BPF Toeplitz
code on it through BPF_PROG_TEST_RUN with only --type (ipv4, tcpv4, udpv4,
ipv6, tcpv6 or udpv6) enabled, and prints the hash as 0x%08x.

With --frame: runs the same code on that Ethernet frame (hex) with the
--type list enabled (comma-separated, or "all"), as the steering programs
would, and prints the hash, or "none" when the frame gets no hash; -v adds
the report type, the input length and the flow lanekit's Go model reads
from the frame (IPv6 extension headers skipped, fragments hashed on their
addresses, see pkg/rss FrameInput).

The key defaults to the Microsoft RSS verification key.`,
	Args: cobra.NoArgs,
	RunE: func(cmd *cobra.Command, _ []string) error {
		o := rssHashOpts
		key, err := rss.KeyOrDefault(o.key)
		if err != nil {
			return err
		}
		t, err := rss.ParseHashTypes(o.typ)
		if err != nil {
			return err
		}
		if o.frame != "" {
			if o.src != "" || o.dst != "" || cmd.Flags().Changed("sport") || cmd.Flags().Changed("dport") {
				return fmt.Errorf("--frame takes no --src, --dst, --sport or --dport: the frame holds them")
			}
			return rssHashFrame(cmd, key, t, o)
		}
		if o.src == "" || o.dst == "" {
			return fmt.Errorf("want --src and --dst (a flow) or --frame (an Ethernet frame)")
		}
		src, err := netip.ParseAddr(o.src)
		if err != nil {
			return fmt.Errorf("--src: %w", err)
		}
		dst, err := netip.ParseAddr(o.dst)
		if err != nil {
			return fmt.Errorf("--dst: %w", err)
		}
		if (t == rss.TypeTCPv4 || t == rss.TypeUDPv4 || t == rss.TypeTCPv6 || t == rss.TypeUDPv6) &&
			(!cmd.Flags().Changed("sport") || !cmd.Flags().Changed("dport")) {
			return fmt.Errorf("hash type %s needs --sport and --dport", t)
		}
		h, err := rss.NewHasher()
		if err != nil {
			return fmt.Errorf("cannot compute the hash in BPF: %w", err)
		}
		defer h.Close()
		res, err := h.Hash(key, t, rss.Flow{Src: src.Unmap(), Dst: dst.Unmap(), Sport: o.sport, Dport: o.dport})
		if err != nil {
			return err
		}
		if o.verbose {
			fmt.Fprintf(cmd.OutOrStdout(), "0x%08x %s (%d input bytes)\n", res.Hash, res.Report, res.InputLen)
			return nil
		}
		fmt.Fprintf(cmd.OutOrStdout(), "0x%08x\n", res.Hash)
		return nil
	},
}

func init() {
	f := rssHashCmd.Flags()
	f.StringVar(&rssHashOpts.key, "key", "", "Toeplitz key, 40 bytes as hex (default: the Microsoft RSS verification key)")
	f.StringVar(&rssHashOpts.typ, "type", "", "hash type: ipv4, tcpv4, udpv4, ipv6, tcpv6 or udpv6")
	f.StringVar(&rssHashOpts.src, "src", "", "source address")
	f.StringVar(&rssHashOpts.dst, "dst", "", "destination address")
	f.Uint16Var(&rssHashOpts.sport, "sport", 0, "source port (tcp/udp types)")
	f.Uint16Var(&rssHashOpts.dport, "dport", 0, "destination port (tcp/udp types)")
	f.BoolVarP(&rssHashOpts.verbose, "verbose", "v", false, "also print the hash report type and input length")
	f.StringVar(&rssHashOpts.frame, "frame", "", "an Ethernet frame as hex: hash it as the steering programs do (--type may then list several types, or all)")
	_ = rssHashCmd.MarkFlagRequired("type")
	rssCmd.AddCommand(rssHashCmd)
	rootCmd.AddCommand(rssCmd)
}

// rssHashFrame prints the BPF hash of the frame in o.frame with types on.
func rssHashFrame(cmd *cobra.Command, key rss.Key, types rss.HashTypes, o rssHashOptions) error {
	frame, err := hex.DecodeString(strings.TrimPrefix(strings.ReplaceAll(o.frame, " ", ""), "0x"))
	if err != nil {
		return fmt.Errorf("--frame: %w", err)
	}
	h, err := rss.NewHasher()
	if err != nil {
		return fmt.Errorf("cannot compute the hash in BPF: %w", err)
	}
	defer h.Close()
	res, err := h.HashFrame(key, types, frame)
	if err != nil {
		return fmt.Errorf("%w (the kernel's test run wants a whole Ethernet header, and a whole IP header after an untagged IP ethertype)", err)
	}
	out := cmd.OutOrStdout()
	if res.Report == rss.ReportNone {
		fmt.Fprintln(out, "none")
		return nil
	}
	if !o.verbose {
		fmt.Fprintf(out, "0x%08x\n", res.Hash)
		return nil
	}
	f, r := rss.FrameInput(frame, types)
	fmt.Fprintf(out, "0x%08x %s (%d input bytes) model: %s %s", res.Hash, res.Report, res.InputLen, r, f.Src)
	if r != rss.ReportIPv4 && r != rss.ReportIPv6 {
		fmt.Fprintf(out, ":%d", f.Sport)
	}
	fmt.Fprintf(out, " -> %s", f.Dst)
	if r != rss.ReportIPv4 && r != rss.ReportIPv6 {
		fmt.Fprintf(out, ":%d", f.Dport)
	}
	fmt.Fprintln(out)
	return nil
}
