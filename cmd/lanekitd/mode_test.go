package main

import (
	"strings"
	"testing"
)

// TestModeFlags: --mode host|dpu are checked before anything starts: the
// link is mutual TLS, each mode needs its addresses, a VF kind its source.
func TestModeFlags(t *testing.T) {
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
		// The files do not exist: refused when loading, before any socket.
		{append([]string{"--mode", "host", "--dpu-addr", "10.0.0.1:7443", "--socket", t.TempDir() + "/s"}, tlsArgs...), "tls: load c"},
	} {
		err := run(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("lanekitd %s = %v, want %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
}
