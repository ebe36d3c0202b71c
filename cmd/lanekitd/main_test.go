package main

import (
	"bytes"
	"errors"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
)

// TestNoMemoryDatapathFlag: the in-memory datapath is a test seam reached
// through the Go API only; the daemon has no flag that selects it.
func TestNoMemoryDatapathFlag(t *testing.T) {
	err := run([]string{"--datapath", "none", "--pod-cidr", "10.9.0.0/24"})
	if err == nil || !strings.Contains(err.Error(), "flag provided but not defined: -datapath") {
		t.Fatalf("--datapath none = %v, want an unknown flag", err)
	}
}

// TestSNATPortsFlag: --nodeport-snat-ports is MIN-MAX, checked before the
// agent starts.
func TestSNATPortsFlag(t *testing.T) {
	for _, bad := range []string{"abc", "61000", "65535-61000", "0-10", "61000-70000", "61000-65535x"} {
		err := run([]string{"--pod-cidr", "10.9.0.0/24", "--nodeport-snat-ports", bad})
		if err == nil || !strings.Contains(err.Error(), "--nodeport-snat-ports") {
			t.Errorf("--nodeport-snat-ports %s = %v, want refused", bad, err)
		}
	}
	if lo, hi, err := parsePortRange("61000-65535"); err != nil || lo != 61000 || hi != 65535 {
		t.Errorf("61000-65535 = %d-%d, %v", lo, hi, err)
	}
}

// TestExternalIPsFlag: a bad --external-ips value is refused before the
// agent starts, naming the flag.
func TestExternalIPsFlag(t *testing.T) {
	for _, bad := range []string{"", "allow", "10.0.0.1/24", "203.0.113.0/24,nope"} {
		err := run([]string{"--pod-cidr", "10.9.0.0/24", "--external-ips", bad})
		if err == nil || !strings.Contains(err.Error(), "external-ips") {
			t.Errorf("--external-ips %q = %v, want refused", bad, err)
		}
	}
}

// TestKubeFlags: the pod CIDR comes from --pod-cidr or from the Node named by
// --node-name; --kubeconfig alone names no node.
func TestKubeFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--pod-cidr is required (or --node-name"},
		{[]string{"--kubeconfig", "/nonexistent"}, "--kubeconfig needs --node-name"},
		{[]string{"--node-name", "n1", "--kubeconfig", "/nonexistent/kubeconfig"}, "kubernetes client config"},
		{[]string{"--pod-cidr", "10.244.0.0/24", "--lb-ipam=true"}, "--lb-ipam and --l2-announce need --node-name"},
		{[]string{"--pod-cidr", "10.244.0.0/24", "--l2-announce=yes"}, `want true or false, got "yes"`},
		// An unset optional ConfigMap key ($(VAR) left as it is) is "off".
		{[]string{"--lb-ipam=$(LANEKIT_LB_IPAM)", "--l2-announce=$(LANEKIT_L2_ANNOUNCE)"}, "--pod-cidr is required (or --node-name"},
	} {
		err := run(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("lanekitd %v = %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestAPIServerFlags: --k8s-service-host/--k8s-service-port reach the
// client configuration; bad combinations and values are refused before the
// agent starts.
func TestAPIServerFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--k8s-service-host", "10.0.0.1", "--pod-cidr", "10.9.0.0/24"}, "--k8s-service-host needs --node-name"},
		{[]string{"--node-name", "n1", "--k8s-service-host", "10.0.0.1", "--kubeconfig", "/k"}, "give one"},
		{[]string{"--node-name", "n1", "--k8s-service-host", "10.0.0.1", "--k8s-service-port", "70000"}, `port "70000" is not a port number`},
		{[]string{"--node-name", "n1", "--k8s-service-host", "[fd00::1]"}, "no brackets"},
	} {
		err := run(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("lanekitd %v = %v, want %q", tc.args, err, tc.want)
		}
	}
}

// parseKube parses args with the agent's Kubernetes flags only.
func parseKube(t *testing.T, args ...string) kubeFlags {
	t.Helper()
	var k kubeFlags
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	k.addFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return k
}

// TestAPIServerConfig: the explicit address with the service account's
// token and CA; an unexpanded $(VAR) (the DaemonSet's optional ConfigMap key
// missing) counts as unset; unset keeps rest.InClusterConfig.
func TestAPIServerConfig(t *testing.T) {
	sa := t.TempDir()
	ca, _, err := certutil.GenerateSelfSignedCertKey("ca", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(sa, "token"), []byte("sa-token"), 0o600)
	os.WriteFile(filepath.Join(sa, "ca.crt"), ca, 0o600)
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--k8s-service-host", "fd00::10", "--k8s-service-port", "8443"}, "https://[fd00::10]:8443"},
		{[]string{"--k8s-service-host", "192.0.2.1"}, "https://192.0.2.1:6443"},
		{[]string{"--k8s-service-host", "api.internal", "--k8s-service-port", "$(LANEKIT_K8S_SERVICE_PORT)"}, "https://api.internal:6443"},
	} {
		k := parseKube(t, append([]string{"--node-name", "n1"}, tc.args...)...)
		k.saDir = sa
		if err := k.validate(); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		cfg, err := k.restConfig(log)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if cfg.Host != tc.want || cfg.BearerToken != "sa-token" || cfg.TLSClientConfig.CAFile != filepath.Join(sa, "ca.crt") {
			t.Errorf("%v: host %q token from %q CA %q, want %s with the service account's", tc.args, cfg.Host, cfg.BearerTokenFile, cfg.TLSClientConfig.CAFile, tc.want)
		}
	}
	// Unset (or an unexpanded reference): the in-cluster Service, with a warning.
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	var logged bytes.Buffer
	k := parseKube(t, "--node-name", "n1", "--k8s-service-host", "$(LANEKIT_K8S_SERVICE_HOST)")
	k.saDir = sa
	if k.api.Set() {
		t.Fatalf("an unexpanded $(VAR) set the host: %+v", k.api)
	}
	_, err = k.restConfig(slog.New(slog.NewTextHandler(&logged, nil)))
	if !errors.Is(err, rest.ErrNotInCluster) {
		t.Errorf("without --k8s-service-host: %v, want rest.InClusterConfig's ErrNotInCluster", err)
	}
	if !strings.Contains(logged.String(), "level=WARN") || !strings.Contains(logged.String(), "without kube-proxy") {
		t.Errorf("no warning about the ClusterIP without kube-proxy: %q", logged.String())
	}
}
