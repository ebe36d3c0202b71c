package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/lanekit/lanekit/pkg/conncheck"
)

// `lanekit connectivity test` (pkg/conncheck) and the two commands its
// test pods run: `serve` (the pods' echo server) and `probe` (run inside a
// pod through its exec API, or its netns in the lab).

var connOpts struct {
	kubeconfig string
	vmSpec     string
	conncheck.Options
	lab bool
}

// labConnRuntime (connectivity_lab.go; nil in the shipped -tags nolab
// build, connectivity_nolab.go) returns the netns lab's runtime and its
// API server's client config.
func connectivityCmd() *cobra.Command {
	group := &cobra.Command{Use: "connectivity", Short: "Check a cluster's pod, Service, policy, DNS and VM connectivity"}
	test := &cobra.Command{
		Use:   "test",
		Short: "Deploy test pods in their own namespace, run every check and print a summary (exit 1 on a failure)",
		RunE:  runConnectivityTest,
	}
	f := test.Flags()
	f.StringVar(&connOpts.kubeconfig, "kubeconfig", "", "kubeconfig (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
	f.StringVar(&connOpts.Namespace, "namespace", "lanekit-conncheck", "namespace the test creates and deletes")
	f.StringVar(&connOpts.Image, "image", "ghcr.io/lanekit/lanekit-agent:v0.1.0", "image of the test pods (runs `lanekit connectivity serve`)")
	f.StringVar(&connOpts.Lanekit, "lanekit-path", "/opt/lanekit/bin/lanekit", "the lanekit CLI's path in --image")
	f.DurationVar(&connOpts.Timeout, "timeout", 30*time.Second, "how long each check waits for its expected outcome")
	f.BoolVar(&connOpts.VM, "vm", false, "also start a KubeVirt VMI on the lanekit binding and reach it")
	f.StringVar(&connOpts.VMImage, "vm-image", "quay.io/kubevirt/cirros-container-disk-demo:latest", "the VMI's containerDisk")
	f.StringVar(&connOpts.vmSpec, "vm-spec", "", "start this VirtualMachineInstance (YAML file, with an interface on the lanekit binding) instead of the --vm-image one")
	if labConnRuntime != nil {
		f.BoolVar(&connOpts.lab, "lab", false, "run against `lanekit lab up --k8s` (pods are network namespaces: probes run there)")
	}
	group.AddCommand(test, connServeCmd(), connProbeCmd())
	return group
}

func runConnectivityTest(cmd *cobra.Command, _ []string) error {
	// Interrupted: the run's context ends, conncheck.Run deletes the
	// namespace on a fresh one.
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o := connOpts.Options
	o.Out = cmd.ErrOrStderr()
	if connOpts.vmSpec != "" {
		b, err := os.ReadFile(connOpts.vmSpec)
		if err != nil {
			return err
		}
		o.VMSpec = b
	}
	var cfg *rest.Config
	var err error
	if connOpts.lab {
		if o.Runtime, cfg, err = labConnRuntime(); err != nil {
			return err
		}
	}
	if cfg == nil || connOpts.kubeconfig != "" {
		if cfg, err = kubeRESTConfig(connOpts.kubeconfig); err != nil {
			return err
		}
	}
	if o.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	if o.Dynamic, err = dynamic.NewForConfig(cfg); err != nil {
		return err
	}
	if o.Runtime == nil {
		o.Runtime = &conncheck.KubeletRuntime{Config: cfg, Client: o.Client, Lanekit: o.Lanekit}
	}
	rep, err := conncheck.Run(ctx, o)
	rep.Print(cmd.OutOrStdout())
	if err != nil {
		return err
	}
	if n := rep.Failed(); n > 0 {
		return fmt.Errorf("connectivity test: %d checks failed", n)
	}
	return nil
}

// kubeRESTConfig loads a kubeconfig the way kubectl does.
func kubeRESTConfig(path string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = path
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return cfg, nil
}

func connServeCmd() *cobra.Command {
	var listen string
	var life time.Duration
	cmd := &cobra.Command{
		Use:    "serve",
		Short:  "Serve TCP echo on --listen for --for (what the connectivity test's pods run)",
		Hidden: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), life)
			defer cancel()
			ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()
			if listen == "" { // the hostNetwork pod only waits for probes
				<-ctx.Done()
				return nil
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("serve: %w", err)
			}
			return conncheck.Serve(ctx, ln)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "", "address to serve TCP echo on (empty: serve nothing, only wait)")
	cmd.Flags().DurationVar(&life, "for", time.Hour, "exit after this long")
	return cmd
}

func connProbeCmd() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:    "probe echo|reach|dns TARGET",
		Short:  "Run one connectivity probe from here (what the connectivity test runs in its pods)",
		Hidden: true,
		Args:   cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			out, err := conncheck.Probe(cmd.Context(), conncheck.ProbeKind(args[0]), args[1], timeout)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), out)
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "give up after this long")
	return cmd
}

func init() { rootCmd.AddCommand(connectivityCmd()) }
