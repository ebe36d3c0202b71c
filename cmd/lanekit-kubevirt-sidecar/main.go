// Command lanekit-kubevirt-sidecar is lanekit's KubeVirt network binding
// plugin sidecar. KubeVirt runs it in each virt-launcher pod whose VMI has an
// interface bound to "lanekit"; it serves KubeVirt's hook API on a unix
// socket in /var/run/kubevirt-hooks and, on OnDefineDomain, turns those
// interfaces into vhost-user NICs on the sockets lanekit reported through
// device-info (the downward API file /etc/podinfo/network-info). In a live
// migration's target pod it builds the interface from that pod's own
// device-info, and fails the target (naming kubevirt#15634) when the pod has
// none rather than define a domain without the NIC.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/lanekit/lanekit/pkg/kubevirt"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "lanekit-kubevirt-sidecar:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("lanekit-kubevirt-sidecar", flag.ContinueOnError)
	binding := fs.String("binding", envOr("LANEKIT_BINDING", kubevirt.BindingName), "network binding plugin name (the key under KubeVirt spec.configuration.network.binding)")
	socket := fs.String("socket", filepath.Join(kubevirt.HooksDir, "lanekit.sock"), "hook socket virt-launcher connects to")
	info := fs.String("network-info", kubevirt.NetworkInfoPath, "downward API file with the pod's network-info (device-info per network)")
	wait := fs.Duration("wait", 45*time.Second, "how long OnDefineDomain waits for the network-info file to list the VMI's lanekit networks (virt-launcher gives a hook one minute)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
	defer stop()
	srv := kubevirt.NewServer(*binding, &kubevirt.InfoSource{Path: *info, Wait: *wait}, log)
	return srv.Serve(ctx, *socket)
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
