package config

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"unicode"
)

// Auth is providers.<name>.auth: how the provider's requests authenticate. Type picks one of three; the
// other keys belong to one type each, and set for another they are an error.
type Auth struct {
	// Type is header, oauth2 or hmac.
	Type string `mapstructure:"type"`
	// Header (type header; default Authorization) carries Prefix, a space and the secret of $SecretEnv.
	Header string `mapstructure:"header"`
	// SecretEnv names the variable holding the secret (types header and hmac).
	SecretEnv string `mapstructure:"secret_env"`
	Prefix    string `mapstructure:"prefix"`
	// TokenURL, ClientIDEnv, ClientSecretEnv, Scopes and Params (type oauth2) are the client credentials
	// grant: a bearer token from the token endpoint, refreshed before it expires.
	TokenURL        string            `mapstructure:"token_url"`
	ClientIDEnv     string            `mapstructure:"client_id_env"`
	ClientSecretEnv string            `mapstructure:"client_secret_env"`
	Scopes          []string          `mapstructure:"scopes"`
	Params          map[string]string `mapstructure:"params"`
	// SignatureHeader (default X-Signature), TimestampHeader (default X-Timestamp) and Encoding (hex,
	// the default, or base64) are type hmac's: HMAC-SHA256 with the secret of $SecretEnv over
	// "<unix seconds>\n<METHOD>\n<path and query as sent>\n<body>".
	SignatureHeader string `mapstructure:"signature_header"`
	TimestampHeader string `mapstructure:"timestamp_header"`
	Encoding        string `mapstructure:"encoding"`
}

// The auth types, and their defaults.
const (
	AuthTypeHeader         = "header"
	AuthTypeOAuth2         = "oauth2"
	AuthTypeHMAC           = "hmac"
	DefaultAuthHeader      = "Authorization"
	DefaultSignatureHeader = "X-Signature"
	DefaultTimestampHeader = "X-Timestamp"
	EncodingHex            = "hex"
	EncodingBase64         = "base64"
)

// reservedParams are the token request's parameters that have keys of their own.
var reservedParams = []string{"grant_type", "scope", "client_id", "client_secret"}

// Authentication is the provider's auth in force: auth, with its type's defaults; or the shorthand
// auth_header and auth_env as {type: header, header: auth_header, secret_env: auth_env}; nil for none.
func (pr Provider) Authentication() *Auth {
	switch {
	case pr.Auth != nil:
		a := *pr.Auth
		return a.withDefaults()
	case pr.AuthHeader != "":
		return &Auth{Type: AuthTypeHeader, Header: pr.AuthHeader, SecretEnv: pr.AuthEnv}
	}
	return nil
}

func (a Auth) withDefaults() *Auth {
	switch a.Type {
	case AuthTypeHeader:
		a.Header = cmp.Or(a.Header, DefaultAuthHeader)
	case AuthTypeHMAC:
		a.SignatureHeader = cmp.Or(a.SignatureHeader, DefaultSignatureHeader)
		a.TimestampHeader = cmp.Or(a.TimestampHeader, DefaultTimestampHeader)
		a.Encoding = cmp.Or(a.Encoding, EncodingHex)
	}
	return &a
}

// AuthSecret is one secret a provider's auth reads: the key naming its variable (relative to the
// provider: auth_env, auth.secret_env, auth.client_id_env, auth.client_secret_env) and the variable.
type AuthSecret struct {
	Key, Env string
}

// AuthSecrets lists the secrets the provider's auth reads, in that order.
func (pr Provider) AuthSecrets() []AuthSecret {
	a := pr.Authentication()
	switch {
	case a == nil:
		return nil
	case pr.Auth == nil:
		return []AuthSecret{{"auth_env", a.SecretEnv}}
	case a.Type == AuthTypeOAuth2:
		return []AuthSecret{{"auth.client_id_env", a.ClientIDEnv}, {"auth.client_secret_env", a.ClientSecretEnv}}
	}
	return []AuthSecret{{"auth.secret_env", a.SecretEnv}}
}

// Headers names the headers the auth sets on a request.
func (a *Auth) Headers() []string {
	switch {
	case a == nil:
		return nil
	case a.Type == AuthTypeOAuth2:
		return []string{DefaultAuthHeader}
	case a.Type == AuthTypeHMAC:
		return []string{a.SignatureHeader, a.TimestampHeader}
	}
	return []string{a.Header}
}

// String describes the auth without its secrets, for check-config: its type, where it goes, and the
// variables the secrets come from.
func (a *Auth) String() string {
	switch {
	case a == nil:
		return "none"
	case a.Type == AuthTypeOAuth2:
		s := fmt.Sprintf("oauth2 client credentials from %s (client $%s, secret $%s)", a.TokenURL, a.ClientIDEnv, a.ClientSecretEnv)
		if len(a.Scopes) > 0 {
			s += ", scopes " + strings.Join(a.Scopes, " ")
		}
		return s
	case a.Type == AuthTypeHMAC:
		return fmt.Sprintf("hmac-sha256 in %s (%s) with %s, key from $%s", a.SignatureHeader, a.Encoding, a.TimestampHeader, a.SecretEnv)
	}
	return fmt.Sprintf("header %s from $%s", a.Header, a.SecretEnv)
}

// validateAuth checks auth (or the shorthand auth_header and auth_env, which validateRequest checks),
// the headers it sets against the provider's own, and the client certificate.
func (pr Provider) validateAuth(p *problems, path string) {
	pr.tlsFiles(path).validate(p)
	if u, err := url.Parse(pr.URL); err == nil && u.Scheme == "http" {
		pr.tlsFiles(path).refuseWithoutTLS(p, "url is http://")
	}
	if pr.Auth == nil {
		return
	}
	if pr.AuthHeader != "" || pr.AuthEnv != "" {
		p.add(path+".auth", "auth_header and auth_env are the shorthand of auth {type: header}: use one or the other")
	}
	a, ap := pr.Authentication(), path+".auth"
	a.checkKeys(p, ap)
	switch a.Type {
	case AuthTypeHeader:
		p.check(headerName.MatchString(a.Header), ap+".header", "must be an HTTP header name, got %q", a.Header)
		p.check(!strings.ContainsFunc(a.Prefix, unicode.IsControl), ap+".prefix", "must hold no control character")
		p.required(ap+".secret_env", a.SecretEnv)
	case AuthTypeOAuth2:
		a.validateOAuth2(p, ap)
	case AuthTypeHMAC:
		p.check(headerName.MatchString(a.SignatureHeader), ap+".signature_header", "must be an HTTP header name, got %q", a.SignatureHeader)
		p.check(headerName.MatchString(a.TimestampHeader) && !strings.EqualFold(a.TimestampHeader, a.SignatureHeader), ap+".timestamp_header",
			"must be an HTTP header name other than signature_header, got %q", a.TimestampHeader)
		p.check(a.Encoding == EncodingHex || a.Encoding == EncodingBase64, ap+".encoding", "must be %s or %s, got %q", EncodingHex, EncodingBase64, a.Encoding)
		p.required(ap+".secret_env", a.SecretEnv)
	default:
		p.add(ap+".type", "must be %s, %s or %s, got %q", AuthTypeHeader, AuthTypeOAuth2, AuthTypeHMAC, a.Type)
		return
	}
	for _, h := range a.Headers() {
		for _, other := range [][2]string{{"merchant_header", pr.MerchantHeader}, {"idempotency_header", pr.IdempotencyHeader}} {
			p.check(!strings.EqualFold(h, other[1]), path+"."+other[0], "must differ from %s, which auth sets", h)
		}
	}
}

// validateOAuth2 checks an oauth2 auth's token endpoint, client variables, scopes and parameters.
func (a *Auth) validateOAuth2(p *problems, ap string) {
	if u, err := url.Parse(a.TokenURL); a.TokenURL == "" {
		p.add(ap+".token_url", "required: the token endpoint, an absolute http or https URL")
	} else {
		p.check(err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.User == nil,
			ap+".token_url", "must be an absolute http or https URL without credentials, got %q", a.TokenURL)
	}
	p.required(ap+".client_id_env", a.ClientIDEnv)
	p.required(ap+".client_secret_env", a.ClientSecretEnv)
	for i, s := range a.Scopes {
		p.check(s != "" && !strings.ContainsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }),
			fmt.Sprintf("%s.scopes[%d]", ap, i), "must be a scope without spaces, got %q", s)
	}
	for k := range a.Params {
		p.check(!slices.Contains(reservedParams, k), ap+".params."+k, "is set by the grant (client_id_env, client_secret_env, scopes): leave it out")
	}
}

// checkKeys refuses the keys of another type than a's.
func (a *Auth) checkKeys(p *problems, ap string) {
	for _, k := range []struct {
		key, typ string
		set      bool
	}{
		{"header", AuthTypeHeader, a.Header != ""},
		{"prefix", AuthTypeHeader, a.Prefix != ""},
		{"secret_env", "header or hmac", a.SecretEnv != ""},
		{"token_url", AuthTypeOAuth2, a.TokenURL != ""},
		{"client_id_env", AuthTypeOAuth2, a.ClientIDEnv != ""},
		{"client_secret_env", AuthTypeOAuth2, a.ClientSecretEnv != ""},
		{"scopes", AuthTypeOAuth2, len(a.Scopes) > 0},
		{"params", AuthTypeOAuth2, len(a.Params) > 0},
		{"signature_header", AuthTypeHMAC, a.SignatureHeader != ""},
		{"timestamp_header", AuthTypeHMAC, a.TimestampHeader != ""},
		{"encoding", AuthTypeHMAC, a.Encoding != ""},
	} {
		if k.set && !slices.Contains(strings.Split(k.typ, " or "), a.Type) {
			p.add(ap+"."+k.key, "is for type %s, not %s", k.typ, a.Type)
		}
	}
}

// required checks a *_env key that must name a variable.
func (p *problems) required(path, name string) {
	if name == "" {
		p.add(path, "required: the name of an environment variable holding the secret")
		return
	}
	p.env(path, name, false)
}

// tlsFiles are the provider's client certificate and the CAs it trusts, under path (providers.<name>).
func (pr Provider) tlsFiles(path string) tlsFiles {
	return tlsFiles{path + ".tls_ca_file", pr.TLSCAFile, path + ".tls_cert_file", pr.TLSCertFile, path + ".tls_key_file", pr.TLSKeyFile}
}

// TLSConfig is the TLS configuration of the provider's connections (its API and its token endpoint) when
// any of providers.<name>.tls_ca_file, tls_cert_file and tls_key_file is set: TLS 1.2 or later, trusting
// tls_ca_file (or the system's roots), presenting the client certificate of tls_cert_file and
// tls_key_file when they are set. Nil with none of them: the transport's defaults. The errors name the
// keys and the files.
func (pr Provider) TLSConfig(name string) (*tls.Config, error) {
	f := pr.tlsFiles("providers." + name)
	if len(f.set()) == 0 {
		return nil, nil
	}
	return f.config()
}

// DescribeTLS is " ca <file>" and " client certificate <file>" for those set (check-config).
func (pr Provider) DescribeTLS() string { return pr.tlsFiles("").describe() }
