package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// caPool reads the PEM certificates in the file that key (a *.tls_ca_file) names. The errors name the key
// and the file; a CA file holds no secret.
func caPool(key, file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: cannot read the CA file: %w", key, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate in %s", key, file)
	}
	return pool, nil
}

// tlsConfig is TLS 1.2 or later, trusting the CAs in caFile, or the system's roots when caFile is empty.
// The server name comes from the address dialled.
func tlsConfig(key, caFile string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pool, err := caPool(key, caFile)
		if err != nil {
			return nil, err
		}
		c.RootCAs = pool
	}
	return c, nil
}

// TLSConfig is the TLS configuration for an amqps:// URL when broker.rabbitmq.tls_ca_file is set: TLS 1.2
// or later, trusting only the CAs in that file. Without the key it returns nil, and amqp091-go uses the
// system's roots and the URL's own TLS parameters (cacertfile, certfile, keyfile, server_name_indication).
func (r RabbitMQ) TLSConfig() (*tls.Config, error) {
	if r.TLSCAFile == "" {
		return nil, nil
	}
	return tlsConfig("broker.rabbitmq.tls_ca_file", r.TLSCAFile)
}

// keyPair reads a client certificate and its private key (PEM) from the files that certKey and keyKey (a
// *.tls_cert_file and its *.tls_key_file) name. The errors name the keys and the files, never the key's
// contents.
func keyPair(certKey, certFile, keyKey, keyFile string) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s: cannot read the client certificate: %w", certKey, err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s: cannot read the private key: %w", keyKey, err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s: %s and %s (%s) are not a PEM certificate and its private key: %w",
			certKey, certFile, keyFile, keyKey, err)
	}
	return cert, nil
}
