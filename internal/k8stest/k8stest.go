// Package k8stest runs a real Kubernetes control plane for tests and the lab:
// etcd and kube-apiserver, built from Go modules by scripts/k8s-bins.sh into a
// per-machine cache, started on one address (127.0.0.1 by default, or inside
// a network namespace) with random free ports, a bearer token with
// system:masters, service-account keys and --endpoint-reconciler-type=none.
// No scheduler, controller-manager or kubelet runs: tests create bound Pods
// and Nodes themselves.
package k8stest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/lanekit/lanekit/internal/nsexec"
	"github.com/lanekit/lanekit/pkg/netdev"
)

// Versions scripts/k8s-bins.sh builds; kube-apiserver matches go.mod's
// k8s.io/api (v0.37.x serves the types client-go v0.37.x decodes).
const (
	KubeVersion = "v1.37.2"
	EtcdVersion = "v3.6.16"
)

// Environment variables.
const (
	// EnvBinDir overrides where etcd and kube-apiserver are found.
	EnvBinDir = "LANEKIT_K8S_BIN_DIR"
	// EnvRequired makes missing binaries a test failure instead of a skip.
	EnvRequired = "LANEKIT_K8S_REQUIRED"
)

// BinDir is where scripts/k8s-bins.sh puts the binaries: $LANEKIT_K8S_BIN_DIR,
// else ${XDG_CACHE_HOME:-$HOME/.cache}/lanekit/k8s/kube-<v>_etcd-<v>.
func BinDir() string {
	if d := os.Getenv(EnvBinDir); d != "" {
		return d
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		cache = filepath.Join(os.Getenv("HOME"), ".cache")
	}
	return filepath.Join(cache, "lanekit", "k8s", "kube-"+KubeVersion+"_etcd-"+EtcdVersion)
}

// Bins returns the paths of etcd and kube-apiserver, or an error saying how
// to build them.
func Bins() (etcd, apiserver string, err error) {
	d := BinDir()
	etcd, apiserver = filepath.Join(d, "etcd"), filepath.Join(d, "kube-apiserver")
	for _, p := range []string{etcd, apiserver} {
		if fi, err := os.Stat(p); err != nil || fi.Mode()&0o111 == 0 {
			return "", "", fmt.Errorf("%s missing: run `make k8s-bins` (scripts/k8s-bins.sh builds etcd %s and kube-apiserver %s into %s)",
				filepath.Base(p), EtcdVersion, KubeVersion, d)
		}
	}
	return etcd, apiserver, nil
}

// Options configure Start.
type Options struct {
	// Dir holds certificates, data, logs and server.json. Empty: a new
	// temporary directory that Stop removes.
	Dir string
	// Netns is the path of a network namespace to run both servers in
	// (the lab's underlay); empty: the caller's.
	Netns string
	// Address the servers bind to and the API server advertises; empty:
	// 127.0.0.1.
	Address string
	// ServiceCIDR is --service-cluster-ip-range ("IPv4,IPv6" for dual-stack);
	// empty: 10.96.0.0/16.
	ServiceCIDR string
	// Cluster serves real nodes (kubelet, controller-manager): the
	// ServiceAccount admission plugin is on (pods get their tokens) and the
	// kubernetes Service's endpoints are the API server's (lease
	// reconciler; Address must not be a loopback address).
	Cluster bool
}

// Server is a running etcd + kube-apiserver. Its fields are saved in
// Dir/server.json so another process (lab down) can find and stop it.
type Server struct {
	Dir         string `json:"dir"`
	Netns       string `json:"netns,omitempty"`
	Address     string `json:"address"`
	ServiceCIDR string `json:"serviceCIDR"`
	EtcdPort    int    `json:"etcdPort"`
	PeerPort    int    `json:"peerPort"`
	APIPort     int    `json:"apiPort"`
	EtcdPID     int    `json:"etcdPID"`
	APIPID      int    `json:"apiserverPID"`
	Token       string `json:"token"`
	Cluster     bool   `json:"cluster,omitempty"`
	tempDir     bool
	procs       map[int]*exec.Cmd // started by this process: reaped on exit
}

// Start starts etcd, then kube-apiserver, and waits until the API server is
// ready. On failure everything started is stopped.
func Start(ctx context.Context, o Options) (_ *Server, err error) {
	etcdBin, _, err := Bins()
	if err != nil {
		return nil, err
	}
	s := &Server{Dir: o.Dir, Netns: o.Netns, Address: o.Address, ServiceCIDR: o.ServiceCIDR, Cluster: o.Cluster, procs: map[int]*exec.Cmd{}}
	if s.Address == "" {
		s.Address = "127.0.0.1"
	}
	if s.ServiceCIDR == "" {
		s.ServiceCIDR = "10.96.0.0/16"
	}
	if s.Dir == "" {
		if s.Dir, err = os.MkdirTemp("", "lanekit-k8s-"); err != nil {
			return nil, err
		}
		s.tempDir = true
	} else if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	if err := s.writeCredentials(); err != nil {
		return nil, fmt.Errorf("k8stest: %w", err)
	}
	ports, err := s.freePorts(3)
	if err != nil {
		return nil, fmt.Errorf("k8stest: free ports: %w", err)
	}
	s.EtcdPort, s.PeerPort, s.APIPort = ports[0], ports[1], ports[2]

	client := fmt.Sprintf("http://%s:%d", s.Address, s.EtcdPort)
	peer := fmt.Sprintf("http://%s:%d", s.Address, s.PeerPort)
	s.EtcdPID, err = s.spawn(etcdBin, "etcd.log",
		"--name=lanekit", "--data-dir="+filepath.Join(s.Dir, "etcd"),
		"--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer,
		"--initial-cluster=lanekit="+peer, "--unsafe-no-fsync", "--log-level=warn")
	if err != nil {
		return nil, fmt.Errorf("k8stest: start etcd: %w", err)
	}
	if err := s.wait(ctx, 30*time.Second, s.EtcdPID, "etcd.log", func(c *http.Client) error {
		resp, err := c.Get(client + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("etcd /health: %s", resp.Status)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("k8stest: etcd: %w", err)
	}
	if err := s.StartAPIServer(ctx); err != nil {
		return nil, err
	}
	return s, s.save()
}

// StartAPIServer (re)starts kube-apiserver on the same port and data and
// waits until /readyz answers.
func (s *Server) StartAPIServer(ctx context.Context) error {
	_, apiBin, err := Bins()
	if err != nil {
		return err
	}
	if nsexec.Alive(s.APIPID) {
		return fmt.Errorf("k8stest: kube-apiserver pid %d is still running", s.APIPID)
	}
	d := s.Dir
	// Without real nodes: the reconciler refuses loopback addresses and
	// nothing needs the kubernetes Service's endpoints; no controller-manager
	// creates the default ServiceAccounts the admission plugin wants.
	reconciler, admission := "--endpoint-reconciler-type=none", "--disable-admission-plugins=ServiceAccount"
	if s.Cluster {
		reconciler, admission = "--endpoint-reconciler-type=lease", "--enable-admission-plugins=ServiceAccount"
	}
	// Admission webhooks and aggregated APIs (KubeVirt's virt-api and
	// virt-operator) are reached at their endpoints, the pods' addresses:
	// no Service datapath runs beside the API server (no kube-proxy; the
	// lab routes the nodes' pod ranges to it). Off, it dials ClusterIPs.
	routing := "--enable-aggregator-routing=" + strconv.FormatBool(s.Cluster)
	args := []string{"--etcd-servers=" + fmt.Sprintf("http://%s:%d", s.Address, s.EtcdPort),
		"--bind-address=" + s.Address, "--advertise-address=" + s.Address,
		"--secure-port=" + strconv.Itoa(s.APIPort),
		"--tls-cert-file=" + filepath.Join(d, "apiserver.crt"), "--tls-private-key-file=" + filepath.Join(d, "apiserver.key"),
		"--cert-dir=" + filepath.Join(d, "certs"),
		"--token-auth-file=" + filepath.Join(d, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + filepath.Join(d, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(d, "sa.key"),
		"--service-cluster-ip-range=" + s.ServiceCIDR,
		reconciler, admission, routing,
		"--kubelet-preferred-address-types=InternalIP",
		"--allow-privileged=true",
		"--profiling=false", "--v=0"}
	s.APIPID, err = s.spawn(apiBin, "kube-apiserver.log", append(args, frontProxyFlags(d)...)...)
	if err != nil {
		return fmt.Errorf("k8stest: start kube-apiserver: %w", err)
	}
	cfg := s.RESTConfig()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	if err := s.wait(ctx, 90*time.Second, s.APIPID, "kube-apiserver.log", func(*http.Client) error {
		resp, err := hc.Get(cfg.Host + "/readyz")
		if err != nil {
			return err
		}
		body, _ := readAll(resp)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s: %s", resp.Status, lastLine(body))
		}
		return nil
	}); err != nil {
		return fmt.Errorf("k8stest: kube-apiserver: %w", err)
	}
	return s.save()
}

// KillAPIServer kills kube-apiserver (SIGKILL, like a crash) and waits until
// it is gone; etcd keeps the data for StartAPIServer.
func (s *Server) KillAPIServer() {
	s.kill(s.APIPID, syscall.SIGKILL)
	s.APIPID = 0
	_ = s.save()
}

// Stop terminates both servers and removes Dir if Start created it.
func (s *Server) Stop() {
	s.kill(s.APIPID, syscall.SIGTERM)
	s.kill(s.EtcdPID, syscall.SIGTERM)
	s.APIPID, s.EtcdPID = 0, 0
	if s.tempDir {
		os.RemoveAll(s.Dir)
	} else {
		_ = s.save()
	}
}

// Load reads the server.json a Start with Options.Dir wrote.
func Load(dir string) (*Server, error) {
	data, err := os.ReadFile(filepath.Join(dir, "server.json"))
	if err != nil {
		return nil, err
	}
	var s Server
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("k8stest: %s: %w", dir, err)
	}
	return &s, nil
}

func (s *Server) save() error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(s.Dir, "server.json"), data, 0o600)
}

// Host is the API server's URL.
func (s *Server) Host() string {
	return "https://" + net.JoinHostPort(s.Address, strconv.Itoa(s.APIPort))
}

// CAFile is the CA that signed the API server's certificate.
func (s *Server) CAFile() string { return filepath.Join(s.Dir, "ca.crt") }

// RESTConfig is an admin client configuration. When the server runs in
// another network namespace, its connections are opened in that namespace.
func (s *Server) RESTConfig() *rest.Config {
	cfg := &rest.Config{
		Host:            s.Host(),
		BearerToken:     s.Token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: s.CAFile()},
		QPS:             200,
		Burst:           400,
		Timeout:         30 * time.Second,
	}
	if s.Netns != "" {
		cfg.Dial = s.dialContext
	}
	return cfg
}

// WriteKubeconfig writes an admin kubeconfig for clients that reach Address
// by routing (no namespace switching).
func (s *Server) WriteKubeconfig(path string) error {
	ca, err := os.ReadFile(s.CAFile())
	if err != nil {
		return err
	}
	c := clientcmdapi.NewConfig()
	c.Clusters["lanekit"] = &clientcmdapi.Cluster{Server: s.Host(), CertificateAuthorityData: ca}
	c.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: s.Token}
	c.Contexts["lanekit"] = &clientcmdapi.Context{Cluster: "lanekit", AuthInfo: "admin"}
	c.CurrentContext = "lanekit"
	return clientcmd.WriteToFile(*c, path)
}

// dialContext opens the connection inside s.Netns.
func (s *Server) dialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := s.inNetns(func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

func (s *Server) inNetns(fn func() error) error {
	if s.Netns == "" {
		return fn()
	}
	return netdev.InNetns(s.Netns, fn)
}

// freePorts returns n distinct free TCP ports on Address (in Netns).
func (s *Server) freePorts(n int) ([]int, error) {
	var ports []int
	err := s.inNetns(func() error {
		var ls []net.Listener
		defer func() {
			for _, l := range ls {
				l.Close()
			}
		}()
		for range n {
			l, err := net.Listen("tcp", net.JoinHostPort(s.Address, "0"))
			if err != nil {
				return err
			}
			ls = append(ls, l)
			ports = append(ports, l.Addr().(*net.TCPAddr).Port)
		}
		return nil
	})
	return ports, err
}

// spawn starts bin detached (own session, output to Dir/log) so a lab's
// servers outlive the command that started them.
func (s *Server) spawn(bin, log string, args ...string) (int, error) {
	cmd, err := nsexec.StartDaemon(s.Netns, filepath.Join(s.Dir, log), bin, args...)
	if err != nil {
		return 0, err
	}
	pid := cmd.Process.Pid
	if s.procs == nil {
		s.procs = map[int]*exec.Cmd{}
	}
	s.procs[pid] = cmd
	return pid, nil
}

// wait polls check until it succeeds, pid dies or the deadline passes.
func (s *Server) wait(ctx context.Context, limit time.Duration, pid int, log string, check func(*http.Client) error) error {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: s.dialContext}}
	deadline := time.Now().Add(limit)
	var last error
	for {
		if !nsexec.Alive(pid) {
			return fmt.Errorf("exited; %s: %s", filepath.Join(s.Dir, log), logTail(filepath.Join(s.Dir, log)))
		}
		if last = check(hc); last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %s: %v; %s: %s", limit, last, filepath.Join(s.Dir, log), logTail(filepath.Join(s.Dir, log)))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *Server) kill(pid int, sig syscall.Signal) {
	if pid <= 0 || !nsexec.Alive(pid) {
		return
	}
	_ = syscall.Kill(pid, sig)
	for deadline := time.Now().Add(10 * time.Second); nsexec.Alive(pid) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if nsexec.Alive(pid) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		for deadline := time.Now().Add(5 * time.Second); nsexec.Alive(pid) && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// Front-proxy (request-header) names, as kubeadm sets them: the API server
// authenticates to aggregated API servers (KubeVirt's virt-api) with a client
// certificate whose CN is FrontProxyClient, signed by a CA of its own, and
// passes the user in the X-Remote-* headers. With these flags kube-apiserver
// itself publishes kube-system/extension-apiserver-authentication (the
// request-header CA and header names), which aggregated servers read.
const (
	FrontProxyClient = "front-proxy-client"
	frontProxyCA     = "front-proxy-ca.crt"
	frontProxyCert   = "front-proxy-client.crt"
	frontProxyKey    = "front-proxy-client.key"
)

// frontProxyFlags are kube-apiserver's request-header and proxy-client flags.
func frontProxyFlags(dir string) []string {
	return []string{
		"--requestheader-client-ca-file=" + filepath.Join(dir, frontProxyCA),
		"--requestheader-allowed-names=" + FrontProxyClient,
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-uid-headers=X-Remote-Uid",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + filepath.Join(dir, frontProxyCert),
		"--proxy-client-key-file=" + filepath.Join(dir, frontProxyKey),
	}
}

// keyPair is a certificate and its key, PEM-encoded.
type keyPair struct {
	cert *x509.Certificate
	key  *rsa.PrivateKey
}

func (k keyPair) certPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: k.cert.Raw})
}

func (k keyPair) keyPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k.key)})
}

// newCert makes a key and a certificate from tmpl, signed by ca (nil: self-signed).
func newCert(tmpl *x509.Certificate, ca *keyPair) (keyPair, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return keyPair{}, err
	}
	now := time.Now()
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(10*365*24*time.Hour)
	parent, signer := tmpl, key
	if ca != nil {
		parent, signer = ca.cert, ca.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		return keyPair{}, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return keyPair{}, err
	}
	return keyPair{cert: cert, key: key}, nil
}

// newCA makes a self-signed CA named cn.
func newCA(cn string, serial int64) (keyPair, error) {
	return newCert(&x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}, nil)
}

// writeCredentials creates a CA and the API server's serving certificate
// (for Address, localhost and 127.0.0.1), the front-proxy CA and client
// certificate, the service-account key pair and the admin token file.
func (s *Server) writeCredentials() error {
	ca, err := newCA("lanekit-test-ca", 1)
	if err != nil {
		return err
	}
	ips := []net.IP{net.ParseIP("127.0.0.1")}
	if ip := net.ParseIP(s.Address); ip != nil && !ip.IsLoopback() {
		ips = append(ips, ip)
	}
	// The kubernetes Service's ClusterIP (the first of the range), which
	// pods dial.
	// (A dual-stack range is "IPv4,IPv6": the IPv4 one is the primary.)
	if _, svc, err := net.ParseCIDR(strings.Split(s.ServiceCIDR, ",")[0]); err == nil && svc.IP.To4() != nil {
		first := slices.Clone(svc.IP.To4())
		first[3]++
		ips = append(ips, first)
	}
	serving, err := newCert(&x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"}, IPAddresses: ips,
	}, &ca)
	if err != nil {
		return err
	}
	fpCA, err := newCA("front-proxy-ca", 3)
	if err != nil {
		return err
	}
	fpClient, err := newCert(&x509.Certificate{
		SerialNumber: big.NewInt(4), Subject: pkix.Name{CommonName: FrontProxyClient},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, &fpCA)
	if err != nil {
		return err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return err
	}
	s.Token = hex.EncodeToString(tok)
	files := map[string][]byte{
		"ca.crt":        ca.certPEM(),
		"apiserver.crt": serving.certPEM(),
		"apiserver.key": serving.keyPEM(),
		frontProxyCA:    fpCA.certPEM(),
		frontProxyCert:  fpClient.certPEM(),
		frontProxyKey:   fpClient.keyPEM(),
		"sa.key":        pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)}),
		"sa.pub":        pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}),
		"tokens.csv":    []byte(s.Token + ",lanekit-admin,lanekit-admin,system:masters\n"),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(s.Dir, name), data, 0o600); err != nil {
			return err
		}
	}
	return os.MkdirAll(filepath.Join(s.Dir, "certs"), 0o700)
}

func readAll(resp *http.Response) ([]byte, error) {
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err := b.ReadFrom(resp.Body)
	return b.Bytes(), err
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// logTail is the end of a log for error messages.
func logTail(path string) string { return nsexec.LogTail(path, 8) }
