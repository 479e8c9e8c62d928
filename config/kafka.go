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
	if k.TLS {
		k.tlsFiles().validate(p)
	} else {
		k.tlsFiles().refuseWithoutTLS(p, "set broker.kafka.tls: true")
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

// TLSConfig is the TLS configuration of every connection to the brokers, nil with broker.kafka.tls off:
// TLS 1.2 or later, trusting the CAs in tls_ca_file (or else the system's roots), presenting the client
// certificate of tls_cert_file and tls_key_file when they are set. The server name comes from the address
// dialled. The errors, about the files (validated already, but read again here), name their keys.
func (k Kafka) TLSConfig() (*tls.Config, error) {
	if !k.TLS {
		return nil, nil
	}
	return k.tlsFiles().config()
}

// Security describes TLS and SASL without secrets, for logs and check-config: whether the password's
// variable is set, never its value.
func (k Kafka) Security() string {
	var parts []string
	if k.TLS {
		parts = append(parts, "tls"+k.tlsFiles().describe())
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
