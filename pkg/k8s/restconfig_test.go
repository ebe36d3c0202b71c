package k8s

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	certutil "k8s.io/client-go/util/cert"
)

// saLayout writes a service-account directory as kubelet mounts it (token,
// ca.crt, namespace) and returns it.
func saLayout(t *testing.T, token string) string {
	t.Helper()
	dir := t.TempDir()
	ca, _, err := certutil.GenerateSelfSignedCertKey("test-ca", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string][]byte{"token": []byte(token), "ca.crt": ca, "namespace": []byte("lanekit-system")} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestServiceAccountConfig: the explicit API server address replaces the
// in-cluster Service's, with the service account's token and CA.
func TestServiceAccountConfig(t *testing.T) {
	dir := saLayout(t, "tok-123")
	for _, tc := range []struct {
		host, port, want string
	}{
		{"10.0.0.1", "6443", "https://10.0.0.1:6443"},
		{"api.example.internal", "443", "https://api.example.internal:443"},
		{"fd00::1", "6443", "https://[fd00::1]:6443"},
		{"API.Example.com", "8443", "https://API.Example.com:8443"},
	} {
		cfg, err := ServiceAccountConfig(APIServer{Host: tc.host, Port: tc.port}, dir)
		if err != nil {
			t.Errorf("%s %s: %v", tc.host, tc.port, err)
			continue
		}
		if cfg.Host != tc.want {
			t.Errorf("%s %s: host %q, want %q", tc.host, tc.port, cfg.Host, tc.want)
		}
		if cfg.BearerToken != "tok-123" || cfg.BearerTokenFile != filepath.Join(dir, "token") {
			t.Errorf("%s: token %q from %q, want the service account's (re-read from its file)", tc.host, cfg.BearerToken, cfg.BearerTokenFile)
		}
		if cfg.TLSClientConfig.CAFile != filepath.Join(dir, "ca.crt") || cfg.TLSClientConfig.Insecure {
			t.Errorf("%s: TLS %+v, want the service account's CA", tc.host, cfg.TLSClientConfig)
		}
	}
}

// TestServiceAccountConfigRefuses: a bad address or a missing credential is
// a clear error, never a client that talks to the wrong place or without TLS.
func TestServiceAccountConfigRefuses(t *testing.T) {
	dir := saLayout(t, "tok")
	noCA := saLayout(t, "tok")
	os.Remove(filepath.Join(noCA, "ca.crt"))
	badCA := saLayout(t, "tok")
	os.WriteFile(filepath.Join(badCA, "ca.crt"), []byte("not a certificate"), 0o600)
	emptyTok := saLayout(t, "\n")
	for _, tc := range []struct {
		host, port, dir, want string
	}{
		{"", "6443", dir, "k8s service host is empty"},
		{"[fd00::1]", "6443", dir, "no brackets"},
		{"10.0.0.1:6443", "6443", dir, "give the port separately"},
		{"https://10.0.0.1", "6443", dir, "no scheme"},
		{"fe80::1%eth0", "6443", dir, "zone"},
		{"bad_host", "6443", dir, "not a host name"},
		{"10.0.0.1", "", dir, `port "" is not a port number`},
		{"10.0.0.1", "0", dir, "not a port number"},
		{"10.0.0.1", "65536", dir, "not a port number"},
		{"10.0.0.1", "https", dir, "not a port number"},
		{"10.0.0.1", "6443", filepath.Join(dir, "missing"), "service-account token"},
		{"10.0.0.1", "6443", emptyTok, "is empty"},
		{"10.0.0.1", "6443", noCA, "service-account CA"},
		{"10.0.0.1", "6443", badCA, "service-account CA"},
	} {
		cfg, err := ServiceAccountConfig(APIServer{Host: tc.host, Port: tc.port}, tc.dir)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("host %q port %q dir %s: %v (config %v), want an error with %q", tc.host, tc.port, filepath.Base(tc.dir), err, cfg, tc.want)
		}
	}
}
