package main

import (
	"fmt"
	"net/netip"

	"github.com/spf13/cobra"

	"github.com/lanekit/lanekit/pkg/rss"
)

var rssCmd = &cobra.Command{
	Use:   "rss",
	Short: "Receive-side scaling: the Toeplitz hash lanekit's BPF programs compute",
}

var rssHashOpts struct {
	key, typ, src, dst string
	sport, dport       uint16
	verbose            bool
}

var rssHashCmd = &cobra.Command{
	Use:   "hash --type ipv4|tcpv4|udpv4|ipv6|tcpv6|udpv6 --src IP --dst IP [--sport N --dport N] [--key HEX]",
	Short: "Print the RSS hash of a flow, computed by the BPF code (needs root: BPF_PROG_TEST_RUN)",
	Long: `Builds a frame of the flow, runs lanekit's BPF Toeplitz code on it through
BPF_PROG_TEST_RUN with only --type enabled, and prints the hash as 0x%08x.
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
	for _, n := range []string{"type", "src", "dst"} {
		_ = rssHashCmd.MarkFlagRequired(n)
	}
	rssCmd.AddCommand(rssHashCmd)
	rootCmd.AddCommand(rssCmd)
}
