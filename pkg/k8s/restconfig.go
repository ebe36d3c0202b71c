package k8s

// The agent's API-server client configuration without kube-proxy. In a pod,
// rest.InClusterConfig reaches the API server at KUBERNETES_SERVICE_HOST,
// the "kubernetes" Service's ClusterIP. On a node where lanekit replaces
// kube-proxy, nothing serves that ClusterIP to host-network processes until
// the agent runs (and lanekit has no socket LB for host traffic yet), so the
// agent is given the API server's own address, as Cilium's
// k8sServiceHost/k8sServicePort, and keeps the pod's service-account token
// and CA.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
)

// ServiceAccountDir is where kubelet mounts a pod's service-account token,
// CA and namespace (the files rest.InClusterConfig reads).
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// APIServer is an explicit API server address: Host is a DNS name or an IP
// address (IPv6 without brackets), Port its secure port.
type APIServer struct {
	Host string
	Port string
}

// Set reports whether an explicit address was given.
func (a APIServer) Set() bool { return a.Host != "" }

// URL is https://host:port, an IPv6 host in brackets.
func (a APIServer) URL() string {
	return "https://" + net.JoinHostPort(a.Host, a.Port)
}

// Validate checks the host and port; errors name the setting at fault.
func (a APIServer) Validate() error {
	h := a.Host
	if h == "" {
		return errors.New("k8s service host is empty")
	}
	if ip, err := netip.ParseAddr(h); err == nil {
		if ip.Zone() != "" {
			return fmt.Errorf("k8s service host %q: an address with a zone is not supported", h)
		}
	} else {
		if strings.ContainsAny(h, ":/[]") {
			return fmt.Errorf("k8s service host %q is not a host name or IP address (give the port separately, no scheme, no brackets)", h)
		}
		if errs := validation.IsDNS1123Subdomain(strings.ToLower(h)); len(errs) > 0 {
			return fmt.Errorf("k8s service host %q is not a host name or IP address: %s", h, strings.Join(errs, "; "))
		}
	}
	p, err := strconv.ParseUint(a.Port, 10, 16)
	if err != nil || p == 0 {
		return fmt.Errorf("k8s service port %q is not a port number (1-65535)", a.Port)
	}
	return nil
}

// ServiceAccountConfig is rest.InClusterConfig with the API server at
// server instead of the "kubernetes" Service: the bearer token (re-read
// from its file as kubelet rotates it) and the CA come from saDir (default
// ServiceAccountDir).
func ServiceAccountConfig(server APIServer, saDir string) (*rest.Config, error) {
	if err := server.Validate(); err != nil {
		return nil, err
	}
	if saDir == "" {
		saDir = ServiceAccountDir
	}
	tokenFile := filepath.Join(saDir, "token")
	caFile := filepath.Join(saDir, "ca.crt")
	token, err := os.ReadFile(tokenFile)
	if err != nil {
		return nil, fmt.Errorf("service-account token: %w", err)
	}
	if len(strings.TrimSpace(string(token))) == 0 {
		return nil, fmt.Errorf("service-account token %s is empty", tokenFile)
	}
	if _, err := certutil.NewPool(caFile); err != nil {
		return nil, fmt.Errorf("service-account CA: %w", err)
	}
	return &rest.Config{
		Host:            server.URL(),
		TLSClientConfig: rest.TLSClientConfig{CAFile: caFile},
		BearerToken:     string(token),
		BearerTokenFile: tokenFile,
	}, nil
}
