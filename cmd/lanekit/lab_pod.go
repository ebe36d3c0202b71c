//go:build !nolab

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/lanekit/lanekit/pkg/lab"
)

func labPodCmd() *cobra.Command {
	c := &cobra.Command{Use: "pod", Short: "Add and delete named pods with Kubernetes identities (namespace, labels, ports) in the lab"}
	var (
		node              int
		namespace, labels string
		ports             string
	)
	add := &cobra.Command{
		Use:   "add NAME",
		Short: "Create a pod on a node through CNI ADD and push its Pod object to every node's agent",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if node == 0 {
				return fmt.Errorf("--node is required")
			}
			l, err := lab.ParseLabels(labels)
			if err != nil {
				return fmt.Errorf("--labels: %w", err)
			}
			pp, err := lab.ParsePorts(ports)
			if err != nil {
				return fmt.Errorf("--port: %w", err)
			}
			bins, err := lab.FindBins()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			p, err := lab.AddPod(ctx, lab.PodOptions{Name: args[0], Node: node, Namespace: namespace, Labels: l, Ports: pp, Bins: bins})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "pod %s/%s on %s: %s (netns %s)\n", p.Namespace, p.Name, lab.NodeNS(p.Node), p.IP, p.NS)
			return nil
		},
	}
	add.Flags().IntVar(&node, "node", 0, "node index (1-based)")
	add.Flags().StringVar(&namespace, "namespace", "default", "the pod's Kubernetes namespace")
	add.Flags().StringVar(&labels, "labels", "", "labels, k=v,k2=v2")
	add.Flags().StringVar(&ports, "port", "", "named container ports, name=80/TCP,dns=53/UDP")
	del := &cobra.Command{
		Use:   "del NAME",
		Short: "Delete a named pod (its Pod object on every agent, CNI DEL, its netns); deleting a missing pod succeeds",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			bins, err := lab.FindBins()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			existed, err := lab.DelPod(ctx, bins, args[0])
			if err != nil {
				return err
			}
			if existed {
				fmt.Fprintf(cmd.OutOrStdout(), "deleted pod %s\n", args[0])
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "no pod %s\n", args[0])
			}
			return nil
		},
	}
	c.AddCommand(add, del)
	return c
}
