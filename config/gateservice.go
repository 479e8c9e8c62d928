package config

import (
	"crypto/tls"
	"fmt"
	"strings"
)

// GateService configures `worker gate serve` (docs/gate-service.md): where it listens, the variable of its
// bearer tokens, and TLS: its certificate, and the CA its callers' client certificates must be signed by
// (mutual TLS).
type GateService struct {
	Listen          string `mapstructure:"listen"`
	TokensEnv       string `mapstructure:"tokens_env"`
	TLSCertFile     string `mapstructure:"tls_cert_file"`
	TLSKeyFile      string `mapstructure:"tls_key_file"`
	TLSClientCAFile string `mapstructure:"tls_client_ca_file"`
}

// MinTokenLen is the shortest bearer token gate_service.tokens_env may hold.
const MinTokenLen = 16

func (g GateService) files() tlsFiles {
	return tlsFiles{"gate_service.tls_client_ca_file", g.TLSClientCAFile, "gate_service.tls_cert_file", g.TLSCertFile,
		"gate_service.tls_key_file", g.TLSKeyFile}
}

// validate checks the address, the variable's name and the TLS files; the tokens themselves are read
// when the service starts (ServiceAuth), so that a worker's configuration needs none.
func (g GateService) validate(p *problems) {
	p.hostPort("gate_service.listen", g.Listen)
	p.env("gate_service.tokens_env", g.TokensEnv, true)
	g.files().validate(p)
	p.check(g.TLSClientCAFile == "" || g.TLSCertFile != "", "gate_service.tls_client_ca_file",
		"needs TLS: set gate_service.tls_cert_file and tls_key_file (the service's certificate)")
}

// Tokens reads the bearer tokens from the variable gate_service.tokens_env names (or its _FILE): one or
// more, separated by commas or new lines. Callers must be authenticated: without tokens, a client CA
// must be set. The errors name the key, never a token.
func (g GateService) Tokens() ([]string, error) {
	var tokens []string
	for t := range strings.FieldsFuncSeq(Secret(g.TokensEnv), func(r rune) bool { return r == ',' || r == '\n' || r == '\r' }) {
		if t = strings.TrimSpace(t); t == "" {
			continue
		}
		if len(t) < MinTokenLen {
			return nil, fmt.Errorf("gate_service.tokens_env: a token in $%s is shorter than %d characters", g.TokensEnv, MinTokenLen)
		}
		tokens = append(tokens, t)
	}
	if len(tokens) == 0 && g.TLSClientCAFile == "" {
		return nil, fmt.Errorf("gate_service.tokens_env: $%s holds no token, and gate_service.tls_client_ca_file is not set: callers must be authenticated (tokens, a client CA, or both)", g.TokensEnv)
	}
	return tokens, nil
}

// ServerTLS is the service's TLS configuration: its certificate, and with tls_client_ca_file, client
// certificates required and verified against it. Nil without tls_cert_file (plain HTTP).
func (g GateService) ServerTLS() (*tls.Config, error) {
	f := g.files()
	cert, err := f.clientCertificate() // the same pair of files, here the server's
	if err != nil || cert == nil {
		return nil, err
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*cert}}
	if g.TLSClientCAFile != "" {
		pool, err := caPool(f.caKey, f.ca)
		if err != nil {
			return nil, err
		}
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return c, nil
}
