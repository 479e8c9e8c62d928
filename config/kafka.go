package config

import (
	"crypto/tls"
	"fmt"
	"slices"
	"strings"
)

// SASLMechanisms are the names broker.kafka.sasl.mechanism takes (kafka-go's sasl/plain and sasl/scram).
var SASLMechanisms = []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}

// validateSecurity checks the TLS and SASL keys: files that are set only with TLS on, and readable; a
// client certificate with its key; a known mechanism with a user.
func (k Kafka) validateSecurity(p *problems) {
	files := []struct{ key, file string }{{"broker.kafka.tls_ca_file", k.TLSCAFile},
		{"broker.kafka.tls_cert_file", k.TLSCertFile}, {"broker.kafka.tls_key_file", k.TLSKeyFile}}
	if !k.TLS {
		for _, f := range files {
			p.check(f.file == "", f.key, "is set, but TLS is off: set broker.kafka.tls: true")
		}
	} else {
		if k.TLSCAFile != "" {
			if _, err := caPool("broker.kafka.tls_ca_file", k.TLSCAFile); err != nil {
				*p = append(*p, err.Error())
			}
		}
		if _, err := k.clientCertificate(); err != nil {
			*p = append(*p, err.Error())
		}
	}
	s := k.SASL
	switch {
	case s.Mechanism == "" && s.Username != "":
		p.add("broker.kafka.sasl.mechanism", "required with broker.kafka.sasl.username: %s", strings.Join(SASLMechanisms, ", "))
	case s.Mechanism == "":
	case !slices.Contains(SASLMechanisms, s.Mechanism):
		p.add("broker.kafka.sasl.mechanism", "must be %s, got %q", strings.Join(SASLMechanisms, ", "), s.Mechanism)
	default:
		p.check(s.Username != "", "broker.kafka.sasl.username", "required with broker.kafka.sasl.mechanism %s", s.Mechanism)
	}
	if s.Mechanism != "" {
		p.env("broker.kafka.sasl.password_env", s.PasswordEnv, false)
	}
}

// clientCertificate reads broker.kafka.tls_cert_file and tls_key_file; nil when neither is set.
func (k Kafka) clientCertificate() (*tls.Certificate, error) {
	switch {
	case k.TLSCertFile == "" && k.TLSKeyFile == "":
		return nil, nil
	case k.TLSKeyFile == "":
		return nil, fmt.Errorf("broker.kafka.tls_key_file: required with broker.kafka.tls_cert_file (the client certificate's private key)")
	case k.TLSCertFile == "":
		return nil, fmt.Errorf("broker.kafka.tls_cert_file: required with broker.kafka.tls_key_file (the certificate of that key)")
	}
	c, err := keyPair("broker.kafka.tls_cert_file", k.TLSCertFile, "broker.kafka.tls_key_file", k.TLSKeyFile)
	if err != nil {
		return nil, err
	}
	return &c, nil
}

// TLSConfig is the TLS configuration of every connection to the brokers, nil with broker.kafka.tls off:
// TLS 1.2 or later, trusting the CAs in tls_ca_file (or else the system's roots), presenting the client
// certificate of tls_cert_file and tls_key_file when they are set. The server name comes from the address
// dialled. The errors, about the files (validated already, but read again here), name their keys.
func (k Kafka) TLSConfig() (*tls.Config, error) {
	if !k.TLS {
		return nil, nil
	}
	c, err := tlsConfig("broker.kafka.tls_ca_file", k.TLSCAFile)
	if err != nil {
		return nil, err
	}
	cert, err := k.clientCertificate()
	if err != nil {
		return nil, err
	}
	if cert != nil {
		c.Certificates = []tls.Certificate{*cert}
	}
	return c, nil
}

// Security describes TLS and SASL without secrets, for logs and check-config: whether the password's
// variable is set, never its value.
func (k Kafka) Security() string {
	var parts []string
	if k.TLS {
		s := "tls"
		if k.TLSCAFile != "" {
			s += " ca " + k.TLSCAFile
		}
		if k.TLSCertFile != "" {
			s += " client certificate " + k.TLSCertFile
		}
		parts = append(parts, s)
	} else {
		parts = append(parts, "plaintext")
	}
	if s := k.SASL; s.Mechanism != "" {
		set := "set"
		if Secret(s.PasswordEnv) == "" {
			set = "not set"
		}
		parts = append(parts, fmt.Sprintf("sasl %s user %q, password from $%s (%s)", s.Mechanism, s.Username, s.PasswordEnv, set))
	}
	return strings.Join(parts, ", ")
}
