package main

import (
	"strings"
	"testing"

	"github.com/lanekit/lanekit/internal/labswitch"
)

// TestModeFlags: --mode host|dpu are checked before anything starts: the
// link is mutual TLS, each mode needs its addresses, a VF kind its source.
func TestModeFlags(t *testing.T) {
	t.Setenv(labswitch.Env, "1") // the veth VF cases: the lab's (lab.go)
	tlsArgs := []string{"--tls-cert", "c", "--tls-key", "k", "--tls-ca", "a"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--mode", "remote"}, `--mode "remote"`},
		{append([]string{"--mode", "host"}, tlsArgs...), "--mode host needs --dpu-addr"},
		{[]string{"--mode", "host", "--dpu-addr", "10.0.0.1:7443"}, "needs --tls-cert, --tls-key and --tls-ca"},
		{[]string{"--mode", "host", "--dpu-addr", "10.0.0.1:7443", "--tls-cert", "c", "--tls-key", "k"}, "needs --tls-cert, --tls-key and --tls-ca"},
		{append([]string{"--mode", "dpu", "--pod-cidr", "10.9.0.0/24"}, tlsArgs...), "--mode dpu needs --dpu-listen"},
		{append([]string{"--mode", "dpu", "--dpu-listen", ":7443", "--vf-kind", "veth", "--pod-cidr", "10.9.0.0/24"}, tlsArgs...), "--vf-kind veth needs --vf-host-netns"},
		{append([]string{"--mode", "dpu", "--dpu-listen", ":7443", "--pod-cidr", "10.9.0.0/24"}, tlsArgs...), "--vf-kind sriov needs --vf-pf"},
		{append([]string{"--mode", "dpu", "--dpu-listen", ":7443", "--vf-kind", "tap", "--pod-cidr", "10.9.0.0/24"}, tlsArgs...), `--vf-kind "tap"`},
		{[]string{"--dpu-host-pf", "lk-pf", "--pod-cidr", "10.9.0.0/24"}, "--dpu-host-pf needs --mode dpu"},
		// Kubernetes: the DPU agent watches for its host, the host agent nothing.
		{append([]string{"--mode", "host", "--dpu-addr", "10.0.0.1:7443", "--node-name", "n1"}, tlsArgs...), "--mode host runs no Kubernetes watchers"},
		{append([]string{"--mode", "dpu", "--dpu-listen", ":7443", "--vf-kind", "veth", "--vf-host-netns", "/run/netns/x", "--node-name", "n1"}, tlsArgs...),
			"--mode dpu with --node-name needs --uplink"},
		// The DPU serves one host: whose certificate must be named.
		{append([]string{"--mode", "dpu", "--dpu-listen", ":7443", "--vf-kind", "veth", "--vf-host-netns", "/run/netns/x", "--pod-cidr", "10.9.0.0/24"}, tlsArgs...),
			"--mode dpu needs --dpu-host-identity"},
		{[]string{"--dpu-host-identity", "h1", "--pod-cidr", "10.9.0.0/24"}, "--dpu-host-identity needs --mode dpu"},
		// The files do not exist: refused when loading, before any socket.
		{append([]string{"--mode", "host", "--dpu-addr", "10.0.0.1:7443", "--socket", t.TempDir() + "/s"}, tlsArgs...), "tls: load c"},
	} {
		err := run(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("lanekitd %s = %v, want %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
}

// TestDPULocation: with the Kubernetes source the DPU agent's Status names
// the host's Node it serves after the link's state; without, the link's.
func TestDPULocation(t *testing.T) {
	link := func() string { return "dpu d1 for host n1" }
	if got := dpuLocation(link, "")(); got != "dpu d1 for host n1" {
		t.Errorf("no node: %q", got)
	}
	if got := dpuLocation(link, "n1")(); got != "dpu d1 for host n1; Kubernetes node n1" {
		t.Errorf("node n1: %q", got)
	}
}
