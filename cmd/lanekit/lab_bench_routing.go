//go:build !nolab

package main

import (
	"errors"

	"github.com/spf13/cobra"

	"github.com/lanekit/lanekit/pkg/bench"
	"github.com/lanekit/lanekit/pkg/lab"
)

// runRoutingBench is lab bench --routing: one lab per routing mode, brought
// up and down in turn for every repetition, the rows of each measured while
// it is up, ratios to each lab's own host-raw and paired across labs.
func runRoutingBench(cmd *cobra.Command, routings []string, opts bench.Options, asJSON bool, chart string) error {
	return runGroupBench(cmd, "--routing", opts, asJSON, chart, func(bins lab.Bins) ([]bench.Group, []bench.CrossRef, error) {
		groups, err := lab.RoutingBenchGroups(bins, routings, nil)
		return groups, lab.RoutingCross, err
	})
}

// runCNIBench is lab bench --cni: one real-node lab per network plugin
// (lanekit, kube-proxy + flannel), brought up and down in turn for every
// repetition, the same pods and commands in each; lanekit's rows are
// paired with each rival's.
func runCNIBench(cmd *cobra.Command, cnis []string, routing string, opts bench.Options, asJSON bool, chart string) error {
	return runGroupBench(cmd, "--cni", opts, asJSON, chart, func(bins lab.Bins) ([]bench.Group, []bench.CrossRef, error) {
		groups, err := lab.RivalBenchGroups(bins, cnis, routing, cmd.ErrOrStderr())
		return groups, lab.RivalCross(cnis), err
	})
}

// runGroupBench measures the groups one lab after the other.
func runGroupBench(cmd *cobra.Command, flag string, opts bench.Options, asJSON bool, chart string,
	mk func(lab.Bins) ([]bench.Group, []bench.CrossRef, error)) error {
	if chart != "" {
		return errors.New("lab bench: --chart does not take " + flag)
	}
	if lab.Exists() {
		return errors.New("lab bench: " + flag + " brings up its own labs (one after the other, every repetition): run `lanekit lab down` first")
	}
	bins, err := lab.FindBins()
	if err != nil {
		return err
	}
	groups, cross, err := mk(bins)
	if err != nil {
		return errors.New("lab bench: " + err.Error())
	}
	opts.Self = bins.Self
	opts.Progress = cmd.ErrOrStderr()
	ctx, cancel := signalContext()
	defer cancel()
	rep, err := bench.RunGroups(ctx, groups, cross, opts)
	if err != nil {
		return err
	}
	if asJSON {
		err = rep.WriteJSON(cmd.OutOrStdout())
	} else {
		err = rep.WriteTable(cmd.OutOrStdout())
	}
	if err != nil {
		return err
	}
	if rep.Failed() {
		return errors.New("lab bench: some measurements failed (see errors)")
	}
	return nil
}
