//go:build !nolab

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/lab"
)

// labApplyCmd applies objects to every lab node's agent: the lab's stand-in
// for an API server all agents watch.
func labApplyCmd() *cobra.Command {
	var file string
	c := &cobra.Command{
		Use:   "apply -f FILE|-",
		Short: "Apply Kubernetes objects (Service, EndpointSlice, NetworkPolicy, Namespace, Pod) to every lab node's agent",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			data, objs, err := readObjects(cmd, file, k8sobj.Kinds...)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			if err := lab.ApplyEverywhere(ctx, data); err != nil {
				return fmt.Errorf("lab apply: %w", err)
			}
			for _, o := range objs {
				fmt.Fprintf(cmd.OutOrStdout(), "applied %s on every node\n", o)
			}
			return nil
		},
	}
	c.Flags().StringVarP(&file, "filename", "f", "", "YAML or JSON file of objects, - for stdin")
	return c
}
