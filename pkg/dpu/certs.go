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
// dpuName and dpuIPs, and a host client certificate for hostName, all
// ECDSA P-256, valid for validFor, into c.Dir (keys mode 0600).
func (c CertSet) WriteCerts(dpuName string, dpuIPs []net.IP, hostName string, validFor time.Duration) error {
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "lanekit DPU link CA"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(validFor),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("certs: CA: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return fmt.Errorf("certs: CA: %w", err)
	}
	if err := writePEM(c.CA(), "CERTIFICATE", caDER, 0o644); err != nil {
		return err
	}
	leaf := func(files TLSFiles, cn string, dns []string, ips []net.IP, usage x509.ExtKeyUsage) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return fmt.Errorf("certs: %w", err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(), Subject: pkix.Name{CommonName: cn}, DNSNames: dns, IPAddresses: ips,
			NotBefore: now.Add(-time.Minute), NotAfter: now.Add(validFor),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return fmt.Errorf("certs: %s: %w", cn, err)
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return fmt.Errorf("certs: %s: %w", cn, err)
		}
		if err := writePEM(files.Cert, "CERTIFICATE", der, 0o644); err != nil {
			return err
		}
		return writePEM(files.Key, "EC PRIVATE KEY", kder, 0o600)
	}
	if err := leaf(c.DPU(), dpuName, []string{dpuName}, dpuIPs, x509.ExtKeyUsageServerAuth); err != nil {
		return err
	}
	return leaf(c.Host(), hostName, []string{hostName}, nil, x509.ExtKeyUsageClientAuth)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	data := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, data, mode); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	return nil
}
