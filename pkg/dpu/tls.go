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
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// TLSFiles are PEM files: this side's certificate and key, and the CA that
// signed the other side's certificate.
type TLSFiles struct {
	Cert, Key, CA string
}

func (f TLSFiles) load() (tls.Certificate, *x509.CertPool, error) {
	if f.Cert == "" || f.Key == "" || f.CA == "" {
		return tls.Certificate{}, nil, errors.New("tls: a certificate, its key and a CA file are all required (mutual TLS)")
	}
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("tls: load %s: %w", f.Cert, err)
	}
	pem, err := os.ReadFile(f.CA)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("tls: read CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return tls.Certificate{}, nil, fmt.Errorf("tls: %s holds no PEM certificate", f.CA)
	}
	return cert, pool, nil
}

// ServerTLS is the DPU agent's side: TLS 1.3, a client certificate signed
// by the CA is required.
func ServerTLS(f TLSFiles) (*tls.Config, error) {
	cert, pool, err := f.load()
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
	}, nil
}

// ClientTLS is the host agent's side: it presents its certificate and
// trusts only a DPU certificate signed by the CA for serverName.
func ClientTLS(f TLSFiles, serverName string) (*tls.Config, error) {
	cert, pool, err := f.load()
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		ServerName:   serverName,
	}, nil
}
