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
	if chart != "" {
		return errors.New("lab bench: --chart does not take --routing")
	}
	if lab.Exists() {
		return errors.New("lab bench: --routing brings up its own labs (one per mode, every repetition): run `lanekit lab down` first")
	}
	bins, err := lab.FindBins()
	if err != nil {
		return err
	}
	groups, err := lab.RoutingBenchGroups(bins, routings, nil)
	if err != nil {
		return errors.New("lab bench: " + err.Error())
	}
	opts.Self = bins.Self
	opts.Progress = cmd.ErrOrStderr()
	ctx, cancel := signalContext()
	defer cancel()
	rep, err := bench.RunGroups(ctx, groups, lab.RoutingCross, opts)
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
