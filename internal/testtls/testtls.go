// Package testtls gives tests a throwaway certificate authority, a server certificate it signed for
// 127.0.0.1 and localhost, client certificates it signs, and a TLS-terminating proxy in front of a plain
// server on loopback: real Redis or RabbitMQ behind a real TLS handshake, without reconfiguring either.
// For tests only.
package testtls

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a self-signed certificate authority and a server certificate it signed.
type CA struct {
	// File is the CA certificate in PEM, for a *.tls_ca_file key.
	File string
	// Server presents the server certificate (SANs 127.0.0.1 and localhost), TLS 1.2 or later.
	Server *tls.Config

	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA makes a CA and a server certificate, both ECDSA P-256 and valid for an hour, and writes the CA
// certificate to a file in t.TempDir().
func NewCA(t testing.TB) *CA {
	t.Helper()
	now := time.Now()
	caKey := newKey(t)
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: "paygate test CA"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leafKey := newKey(t)
	leafTmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return &CA{
		File: file,
		Server: &tls.Config{
			MinVersion:   tls.VersionTLS12,
			Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER, caDER}, PrivateKey: leafKey}},
		},
		cert: caCert,
		key:  caKey,
	}
}

// RequireClients is Server that also requires a client certificate the CA signed.
func (ca *CA) RequireClients() *tls.Config {
	c := ca.Server.Clone()
	c.ClientAuth = tls.RequireAndVerifyClientCert
	c.ClientCAs = x509.NewCertPool()
	c.ClientCAs.AddCert(ca.cert)
	return c
}

// Client makes a client certificate the CA signed for name, valid for an hour, and writes it and its
// private key (PKCS #8) as PEM files in t.TempDir(), for a *.tls_cert_file and its *.tls_key_file.
func (ca *CA) Client(t testing.TB, name string) (certFile, keyFile string) {
	t.Helper()
	now := time.Now()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// ServerFiles writes the server certificate (with the CA's after it) and its private key (PKCS #8) as PEM
// files in t.TempDir(), for a server that reads its own, such as redis-server's tls-cert-file and
// tls-key-file.
func (ca *CA) ServerFiles(t testing.TB) (certFile, keyFile string) {
	t.Helper()
	leaf := ca.Server.Certificates[0]
	var chain []byte
	for _, der := range leaf.Certificate {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(leaf.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	if err := os.WriteFile(certFile, chain, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Proxy terminates TLS on a loopback port and forwards each connection, once its handshake succeeded, to
// a plain backend. It stops, and closes every connection, when the test ends.
type Proxy struct {
	// Addr is the proxy's 127.0.0.1:port.
	Addr string

	forwarded, refused atomic.Int64
	mu                 sync.Mutex
	conns              map[net.Conn]bool
	closed             bool
	wg                 sync.WaitGroup
}

// Proxy starts a TLS proxy presenting the CA's server certificate in front of backend (host:port).
func (ca *CA) Proxy(t testing.TB, backend string) *Proxy {
	t.Helper()
	return ProxyWith(t, backend, ca.Server)
}

// ProxyWith starts a TLS proxy in front of backend (host:port) that handshakes with server: RequireClients
// for a proxy that forwards only the connections presenting a client certificate the CA signed.
func ProxyWith(t testing.TB, backend string, server *tls.Config) *Proxy {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), conns: map[net.Conn]bool{}}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !p.track(c) {
				return
			}
			p.wg.Go(func() { p.serve(c.(*tls.Conn), backend) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		p.closed = true
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// Forwarded counts the connections whose handshake succeeded and that reached the backend.
func (p *Proxy) Forwarded() int64 { return p.forwarded.Load() }

// Refused counts the connections whose TLS handshake failed: nothing of theirs reached the backend.
func (p *Proxy) Refused() int64 { return p.refused.Load() }

// Drop closes every connection open through the proxy, as a network failure or a server restart would;
// the proxy keeps accepting new ones.
func (p *Proxy) Drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// track registers a connection to close at the end; false (and the connection closed) once stopping.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = true
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) serve(c *tls.Conn, backend string) {
	defer p.untrack(c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.HandshakeContext(ctx); err != nil {
		p.refused.Add(1)
		return
	}
	b, err := net.Dial("tcp", backend)
	if err != nil {
		return
	}
	if !p.track(b) {
		return
	}
	defer p.untrack(b)
	p.forwarded.Add(1)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(b, c)
	go pipe(c, b)
	<-done // either side closed: close both, which ends the other copy
	c.Close()
	b.Close()
	<-done
}
