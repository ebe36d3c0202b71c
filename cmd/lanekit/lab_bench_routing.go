//go:build !nolab

package main

import (
	"encoding/json"
	"errors"
	"fmt"

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
func runCNIBench(cmd *cobra.Command, cnis []string, routing string, policies []int, policiesOnly bool, opts bench.Options, asJSON bool, chart string) error {
	return runGroupBench(cmd, "--cni", opts, asJSON, chart, func(bins lab.Bins) ([]bench.Group, []bench.CrossRef, error) {
		groups, err := lab.RivalBenchGroups(bins, cnis, routing, policies, policiesOnly, cmd.ErrOrStderr())
		return groups, lab.RivalCross(cnis, routing, policies, policiesOnly), err
	})
}

// runCNIServiceBench is lab bench --cni --services: the service rows of
// each network's real-node lab, lab after lab.
func runCNIServiceBench(cmd *cobra.Command, cnis []string, routing string, counts []int, so bench.SvcOptions, asJSON bool) error {
	if lab.Exists() {
		return errors.New("lab bench: --cni brings up its own labs: run `lanekit lab down` first")
	}
	for _, n := range counts {
		if n < 1 || n > bench.MaxSvcSetSize {
			return fmt.Errorf("lab bench: --services %d: want 1..%d", n, bench.MaxSvcSetSize)
		}
	}
	bins, err := lab.FindBins()
	if err != nil {
		return err
	}
	so.Self = bins.Self
	so.Progress = cmd.ErrOrStderr()
	ctx, cancel := signalContext()
	defer cancel()
	rep, err := lab.RunRivalServices(ctx, bins, cnis, routing, counts, so, cmd.ErrOrStderr())
	if err != nil {
		return fmt.Errorf("lab bench: %w", err)
	}
	if asJSON {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
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
