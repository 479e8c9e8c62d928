package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
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

// tlsFiles are one connection's TLS files and the keys that name them: the CAs to trust, and a client
// certificate with its private key. Redis, RabbitMQ and Kafka read theirs alike.
type tlsFiles struct {
	caKey, ca     string
	certKey, cert string
	keyKey, key   string
}

// set names the keys whose files are set, in the order ca, cert, key.
func (f tlsFiles) set() []string {
	var keys []string
	for _, k := range [][2]string{{f.caKey, f.ca}, {f.certKey, f.cert}, {f.keyKey, f.key}} {
		if k[1] != "" {
			keys = append(keys, k[0])
		}
	}
	return keys
}

// refuseWithoutTLS adds a problem for each file set while TLS is off; hint says how to turn it on.
func (f tlsFiles) refuseWithoutTLS(p *problems, hint string) {
	for _, key := range f.set() {
		p.add(key, "is set, but TLS is off: %s", hint)
	}
}

// validate reads the CA file and the client certificate, as the connection will, and adds their errors.
func (f tlsFiles) validate(p *problems) {
	if f.ca != "" {
		if _, err := caPool(f.caKey, f.ca); err != nil {
			*p = append(*p, err.Error())
		}
	}
	if _, err := f.clientCertificate(); err != nil {
		*p = append(*p, err.Error())
	}
}

// clientCertificate reads the client certificate and its private key; nil when neither is set, an error
// naming the missing key when only one is.
func (f tlsFiles) clientCertificate() (*tls.Certificate, error) {
	switch {
	case f.cert == "" && f.key == "":
		return nil, nil
	case f.key == "":
		return nil, fmt.Errorf("%s: required with %s (the client certificate's private key)", f.keyKey, f.certKey)
	case f.cert == "":
		return nil, fmt.Errorf("%s: required with %s (the certificate of that key)", f.certKey, f.keyKey)
	}
	c, err := keyPair(f.certKey, f.cert, f.keyKey, f.key)
	if err != nil {
		return nil, err
	}
	return &c, nil
}

// config is tlsConfig presenting the client certificate, when one is set. The errors, about the files
// (validated already, but read again here), name their keys.
func (f tlsFiles) config() (*tls.Config, error) {
	c, err := tlsConfig(f.caKey, f.ca)
	if err != nil {
		return nil, err
	}
	cert, err := f.clientCertificate()
	if err != nil {
		return nil, err
	}
	if cert != nil {
		c.Certificates = []tls.Certificate{*cert}
	}
	return c, nil
}

// describe is " ca <file>" and " client certificate <file>" for those set, for logs and check-config.
func (f tlsFiles) describe() string {
	s := ""
	if f.ca != "" {
		s += " ca " + f.ca
	}
	if f.cert != "" {
		s += " client certificate " + f.cert
	}
	return s
}

func (r Redis) tlsFiles() tlsFiles {
	return tlsFiles{"redis.tls_ca_file", r.TLSCAFile, "redis.tls_cert_file", r.TLSCertFile, "redis.tls_key_file", r.TLSKeyFile}
}

func (r RabbitMQ) tlsFiles() tlsFiles {
	return tlsFiles{"broker.rabbitmq.tls_ca_file", r.TLSCAFile, "broker.rabbitmq.tls_cert_file", r.TLSCertFile,
		"broker.rabbitmq.tls_key_file", r.TLSKeyFile}
}

func (k Kafka) tlsFiles() tlsFiles {
	return tlsFiles{"broker.kafka.tls_ca_file", k.TLSCAFile, "broker.kafka.tls_cert_file", k.TLSCertFile,
		"broker.kafka.tls_key_file", k.TLSKeyFile}
}

// TLSConfig is the TLS configuration for an amqps:// URL when any of broker.rabbitmq.tls_ca_file,
// tls_cert_file and tls_key_file is set: TLS 1.2 or later, trusting only the CAs in tls_ca_file (or, without
// it, the system's roots), presenting the client certificate of tls_cert_file and tls_key_file when they
// are set. amqp091-go dials with it as given. With none of the keys it returns nil, and amqp091-go uses
// the system's roots and the URL's own TLS parameters (cacertfile, certfile, keyfile,
// server_name_indication).
func (r RabbitMQ) TLSConfig() (*tls.Config, error) {
	f := r.tlsFiles()
	if len(f.set()) == 0 {
		return nil, nil
	}
	return f.config()
}

// CheckTLSURL refuses an AMQP URL (read from $url_env) that is not amqps:// while a broker.rabbitmq TLS
// file is set: the files would not apply to it. The error names the keys set and the variable, not the
// URL, which holds the password.
func (r RabbitMQ) CheckTLSURL(url string) error {
	keys := r.tlsFiles().set()
	if len(keys) == 0 || strings.HasPrefix(strings.ToLower(url), "amqps://") {
		return nil
	}
	verb := "is"
	if len(keys) > 1 {
		verb = "are"
	}
	return fmt.Errorf("%s: %s set, but $%s is not an amqps:// URL", strings.Join(keys, ", "), verb, r.URLEnv)
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
