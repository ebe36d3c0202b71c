package dpu

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CertSet names the files WriteCerts creates in a directory.
type CertSet struct {
	Dir string
}

// CA is the CA certificate both sides trust.
func (c CertSet) CA() string { return filepath.Join(c.Dir, "ca.pem") }

// DPU is the DPU agent's certificate and key.
func (c CertSet) DPU() TLSFiles {
	return TLSFiles{Cert: filepath.Join(c.Dir, "dpu.pem"), Key: filepath.Join(c.Dir, "dpu-key.pem"), CA: c.CA()}
}

// Host is the host agent's certificate and key.
func (c CertSet) Host() TLSFiles {
	return TLSFiles{Cert: filepath.Join(c.Dir, "host.pem"), Key: filepath.Join(c.Dir, "host-key.pem"), CA: c.CA()}
}

// WriteCerts makes a CA (its key is not kept), a DPU server certificate for
// dpuName and dpuIPs, and a host client certificate for hostName (the
// identity the DPU agent's --dpu-host-identity names), all ECDSA P-256,
// valid for validFor, into c.Dir (keys mode 0600).
func (c CertSet) WriteCerts(dpuName string, dpuIPs []net.IP, hostName string, validFor time.Duration) error {
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	ca, err := NewCA(validFor)
	if err != nil {
		return err
	}
	if err := ca.WriteCert(c.CA()); err != nil {
		return err
	}
	if err := ca.IssueServer(c.DPU(), dpuName, dpuIPs, validFor); err != nil {
		return err
	}
	return ca.IssueClient(c.Host(), hostName, validFor)
}

// LinkCA signs the link's certificates (WriteCerts; tests issue more from
// one CA).
type LinkCA struct {
	cert *x509.Certificate
	der  []byte
	key  *ecdsa.PrivateKey
}

// NewCA makes a CA valid for validFor.
func NewCA(validFor time.Duration) (*LinkCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "lanekit DPU link CA"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(validFor),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("certs: CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certs: CA: %w", err)
	}
	return &LinkCA{cert: cert, der: der, key: key}, nil
}

// WriteCert writes the CA's certificate (PEM) to path.
func (ca *LinkCA) WriteCert(path string) error { return writePEM(path, "CERTIFICATE", ca.der, 0o644) }

// IssueServer writes a DPU certificate for name (a DNS SAN and the CN) and
// ips, and its key, to files.Cert and files.Key.
func (ca *LinkCA) IssueServer(files TLSFiles, name string, ips []net.IP, validFor time.Duration) error {
	return ca.issue(files, name, ips, x509.ExtKeyUsageServerAuth, validFor)
}

// IssueClient writes a host certificate for name (a DNS SAN and the CN).
func (ca *LinkCA) IssueClient(files TLSFiles, name string, validFor time.Duration) error {
	return ca.issue(files, name, nil, x509.ExtKeyUsageClientAuth, validFor)
}

func (ca *LinkCA) issue(files TLSFiles, cn string, ips []net.IP, usage x509.ExtKeyUsage, validFor time.Duration) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: cn}, DNSNames: []string{cn}, IPAddresses: ips,
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(validFor),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return fmt.Errorf("certs: %s: %w", cn, err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("certs: %s: %w", cn, err)
	}
	// The key first: a reload between the two writes sees a pair that does
	// not match, refuses it and keeps the old one until the certificate
	// follows.
	if err := writePEM(files.Key, "EC PRIVATE KEY", kder, 0o600); err != nil {
		return err
	}
	return writePEM(files.Cert, "CERTIFICATE", der, 0o644)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

// writePEM writes the file whole or not at all (a temporary file renamed
// over path: a reloading agent never reads half a file) with mode, whatever
// mode an older file at path had (os.WriteFile keeps an existing file's).
func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	defer os.Remove(f.Name()) // after the rename: nothing
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("certs: %w", err)
	}
	if err := pem.Encode(f, &pem.Block{Type: typ, Bytes: der}); err != nil {
		f.Close()
		return fmt.Errorf("certs: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("certs: write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	return nil
}
