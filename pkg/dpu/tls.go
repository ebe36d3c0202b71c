// Package dpu is the host/DPU split (issue 28). The DPU agent is a lanekitd
// that owns the node's pod CIDR and the BPF datapath, with pod devices that
// are VF representors (Representors) and a DPU service on TCP with mutual
// TLS (Server). The host agent (Host) serves the agent API on the node's
// unix socket to the unchanged CNI plugin and CLI: endpoints are created on
// the DPU and their VFs moved into the pods here; everything else (Services,
// policy, status) is forwarded to the DPU. The host namespace holds no
// lanekit programs, maps or pod routes.
package dpu

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	apiv1 "github.com/lanekit/lanekit/api/v1"
)

// ExpiryWarning is how long before a link certificate's notAfter the agent
// logs and `lanekit status` warns: time to rotate before the link breaks.
const ExpiryWarning = 14 * 24 * time.Hour

// TLSFiles are PEM files: this side's certificate and key, and the CA that
// signed the other side's certificate.
type TLSFiles struct {
	Cert, Key, CA string
}

// readKey reads a private key file, refusing one that group or others may
// read: a key the whole node can read lets any local user be this side.
func readKey(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("tls: key: %w", err)
	}
	if m := fi.Mode().Perm(); m&0o077 != 0 {
		return nil, fmt.Errorf("tls: key %s is readable by group or others (mode %04o): chmod 0600 it (a Secret volume: defaultMode 0400)", path, m)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tls: key: %w", err)
	}
	return data, nil
}

// Creds are one side's certificate, key and CA. The files are read again at
// each handshake (and each status or scrape): replaced files take effect for
// the next connection without a restart. Files that do not load (a
// half-rotated pair, a key others can read) are refused and the last good
// ones stay in use (ReloadError says why).
type Creds struct {
	files TLSFiles
	log   *slog.Logger

	mu        sync.Mutex
	raw       [3][]byte // certificate, key, CA as last read
	cert      *tls.Certificate
	pool      *x509.CertPool
	ca        *x509.Certificate // the first certificate of the CA file
	reloadErr error
	peer      *x509.Certificate // the other side's, as last presented
}

// LoadCreds reads f; unlike a reload, a first load that fails is an error.
func LoadCreds(f TLSFiles, log *slog.Logger) (*Creds, error) {
	if f.Cert == "" || f.Key == "" || f.CA == "" {
		return nil, errors.New("tls: a certificate, its key and a CA file are all required (mutual TLS)")
	}
	if log == nil {
		log = slog.Default()
	}
	c := &Creds{files: f, log: log}
	if err := c.reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// reload reads the files and, when they changed, parses them; it keeps the
// last good set on failure. c.mu is not held.
func (c *Creds) reload() error {
	var raw [3][]byte
	var err error
	if raw[0], err = os.ReadFile(c.files.Cert); err != nil {
		return c.failed(fmt.Errorf("tls: load %s: %w", c.files.Cert, err))
	}
	if raw[1], err = readKey(c.files.Key); err != nil {
		return c.failed(err)
	}
	if raw[2], err = os.ReadFile(c.files.CA); err != nil {
		return c.failed(fmt.Errorf("tls: read CA: %w", err))
	}
	c.mu.Lock()
	same := c.cert != nil && bytes.Equal(raw[0], c.raw[0]) && bytes.Equal(raw[1], c.raw[1]) && bytes.Equal(raw[2], c.raw[2])
	c.mu.Unlock()
	if same {
		c.setErr(nil)
		return nil
	}
	cert, err := tls.X509KeyPair(raw[0], raw[1])
	if err != nil {
		return c.failed(fmt.Errorf("tls: load %s: %w", c.files.Cert, err))
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(raw[2]) {
		return c.failed(fmt.Errorf("tls: %s holds no PEM certificate", c.files.CA))
	}
	var ca *x509.Certificate
	if b, _ := pem.Decode(raw[2]); b != nil {
		ca, _ = x509.ParseCertificate(b.Bytes)
	}
	c.mu.Lock()
	first := c.cert == nil
	c.raw, c.cert, c.pool, c.ca, c.reloadErr = raw, &cert, pool, ca, nil
	c.mu.Unlock()
	if !first {
		c.log.Info("reloaded the DPU link's certificates", "cert", c.files.Cert, "subject", cert.Leaf.Subject.String(),
			"not_after", cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// failed records a reload error (logged once per distinct error) and
// returns it.
func (c *Creds) failed(err error) error {
	c.mu.Lock()
	same := c.reloadErr != nil && c.reloadErr.Error() == err.Error()
	c.mu.Unlock()
	if !same {
		c.log.Warn("DPU link certificates not (re)loaded: keeping the last good ones", "err", err)
	}
	c.setErr(err)
	return err
}

func (c *Creds) setErr(err error) {
	c.mu.Lock()
	c.reloadErr = err
	c.mu.Unlock()
}

// current reloads the files if they changed and returns the certificate and
// CA pool in use.
func (c *Creds) current() (*tls.Certificate, *x509.CertPool) {
	c.reload() // an error is recorded; the last good set stays
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cert, c.pool
}

// ReloadError is why the files last failed to load (nil: in use as on disk).
func (c *Creds) ReloadError() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reloadErr
}

// verifier checks the other side's chain against the CA in use (read again
// now) for usage, and its name when dnsName is set (then it is the peer the
// status shows).
func (c *Creds) verifier(dnsName string, usage x509.ExtKeyUsage) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("tls: the other side presented no certificate")
		}
		_, pool := c.current()
		inter := x509.NewCertPool()
		for _, ic := range cs.PeerCertificates[1:] {
			inter.AddCert(ic)
		}
		leaf := cs.PeerCertificates[0]
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, DNSName: dnsName,
			KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			return fmt.Errorf("tls: certificate %q: %w", leaf.Subject.CommonName, err)
		}
		if dnsName != "" {
			c.setPeer(leaf)
		}
		return nil
	}
}

// setPeer records the other side's certificate once it is known to be the
// expected peer (the DPU's: at the handshake; the host's: when a call
// passes the identity check).
func (c *Creds) setPeer(x *x509.Certificate) {
	c.mu.Lock()
	c.peer = x
	c.mu.Unlock()
}

// ServerConfig is the DPU agent's side: TLS 1.3, a client certificate
// signed by the CA (for client authentication) is required; the
// certificate and the CA are the files' as of each handshake. Which host
// the certificate names is checked on every call (Server).
func (c *Creds) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			cert, _ := c.current()
			return cert, nil
		},
		// Any certificate is asked for; VerifyConnection verifies it
		// against the CA read at this handshake (ClientCAs would be fixed).
		ClientAuth:       tls.RequireAnyClientCert,
		VerifyConnection: c.verifier("", x509.ExtKeyUsageClientAuth),
	}
}

// ClientConfig is the host agent's side: it presents its certificate and
// trusts only a DPU certificate signed by the CA for serverName (a DNS
// name or an IP address SAN), both as the files are at each handshake.
func (c *Creds) ClientConfig(serverName string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, _ := c.current()
			return cert, nil
		},
		ServerName: serverName,
		// The built-in verification would use a RootCAs fixed now:
		// VerifyConnection does the same checks (chain to the CA, server
		// usage, serverName) with the CA read at each handshake.
		InsecureSkipVerify: true,
		VerifyConnection:   c.verifier(serverName, x509.ExtKeyUsageServerAuth),
	}
}

// Certificates describes this side's certificate, the CA and the other
// side's last presented one, as `lanekit status` prints them.
func (c *Creds) Certificates() []*apiv1.LinkCertificate {
	c.current()
	c.mu.Lock()
	defer c.mu.Unlock()
	row := func(which string, x *x509.Certificate, file string) *apiv1.LinkCertificate {
		return &apiv1.LinkCertificate{Which: which, Subject: x.Subject.String(), NotAfterUnix: x.NotAfter.Unix(), File: file}
	}
	out := []*apiv1.LinkCertificate{row("local", c.cert.Leaf, c.files.Cert)}
	if c.ca != nil {
		out = append(out, row("ca", c.ca, c.files.CA))
	}
	if c.peer != nil {
		out = append(out, row("peer", c.peer, ""))
	}
	return out
}

// ServerTLS is ServerConfig for files loaded once now (tests, one-shot
// clients).
func ServerTLS(f TLSFiles) (*tls.Config, error) {
	c, err := LoadCreds(f, nil)
	if err != nil {
		return nil, err
	}
	return c.ServerConfig(), nil
}

// ClientTLS is ClientConfig for files loaded now.
func ClientTLS(f TLSFiles, serverName string) (*tls.Config, error) {
	c, err := LoadCreds(f, nil)
	if err != nil {
		return nil, err
	}
	return c.ClientConfig(serverName), nil
}
