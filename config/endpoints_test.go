package config_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/internal/testtls"
	"github.com/paygate/paygate/job"
)

// Endpoints under one provider: each checked with its path (operation, method, path, cost), the method
// defaulting to the provider's, and what the job decoder gets from them.
func TestEndpoints(t *testing.T) {
	const base = "providers: {acme: {url: 'https://api.example.com/v2/', timeout: 1s, limits: [{requests: 10, per: 1s}, {requests: 100, per: 1m}]"
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{"payouts and refunds", `, method: put, endpoints: {payouts: {path: /payouts}, refunds: {method: post, path: '/payments/{payload.payment_id}/refunds?m={merchant}', cost: 2}, status: {method: get, path: '/payouts/{id}'}}`, nil},
		{"bad ones", `, endpoints: {a: {path: payouts}, b: {method: HEAD, path: '/x/{amount}'}, c: {path: '/x', cost: 11}, d: {path: '/a b'}, e: {path: '/{id'}}`, []string{
			`providers.acme.endpoints.a.path: must start with '/', got "payouts"`,
			`providers.acme.endpoints.b.method: must be GET, POST, PUT, PATCH, DELETE, got "HEAD"`,
			`providers.acme.endpoints.b.path: unknown placeholder {amount} (want {id}, {merchant}, {idempotency_key} or {payload.<field>}), got "/x/{amount}"`,
			`providers.acme.endpoints.c.cost: must be 1..10 (the provider's smallest limit; 0 or left out: 1), got 11`,
			`providers.acme.endpoints.d.path: must hold no space, control character or '#' (escape them), got "/a b"`,
			`providers.acme.endpoints.e.path: placeholder "{id" is not closed, got "/{id"`}},
		{"an operation no job can name", `, endpoints: {'pay.outs': {path: /payouts}}`, []string{
			`providers.acme.endpoints.pay.outs: an operation must match [a-z0-9_-]{1,64} (the job's operation)`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := config.Load(writeFile(t, base+tt.yaml+"}}\n"))
			wantProblems(t, err, tt.want)
			if tt.want != nil {
				return
			}
			eps := c.Providers["acme"].Endpoints
			if eps["payouts"].Method != "PUT" || eps["refunds"].Method != "POST" || eps["status"].Method != "GET" {
				t.Fatalf("methods: %+v", eps)
			}
			je := c.JobEndpoints()["acme"]
			if len(je) != 3 || je["refunds"].Cost != 2 || strings.Join(je["refunds"].Fields, ",") != "payload.payment_id,merchant" ||
				je["payouts"].Cost != 0 || len(je["payouts"].Fields) != 0 || strings.Join(je["status"].Fields, ",") != job.FieldID {
				t.Fatalf("job endpoints: %+v", je)
			}
		})
	}
}

// Every auth type with its defaults; keys of another type, missing keys and the shorthand beside auth
// refused with their paths; the client certificate checked as Redis's is.
func TestAuth(t *testing.T) {
	t.Setenv("ACME_SECRET", "hunter2")
	const base = "providers: {acme: {url: 'https://api.example.com/v2', timeout: 1s, limits: [{requests: 10, per: 1s}]"
	tests := []struct {
		name string
		yaml string
		want []string
		auth string // Authentication().String()
	}{
		{"none", "", nil, "none"},
		{"the shorthand", ", auth_header: X-Api-Key, auth_env: ACME_SECRET", nil, "header X-Api-Key from $ACME_SECRET"},
		{"header", ", auth: {type: header, secret_env: ACME_SECRET, prefix: Bearer}", nil, "header Authorization from $ACME_SECRET"},
		{"oauth2", ", auth: {type: oauth2, token_url: 'https://auth.example.com/token', client_id_env: ACME_ID, client_secret_env: ACME_SECRET, scopes: [payouts, refunds], params: {audience: payments}}", nil,
			"oauth2 client credentials from https://auth.example.com/token (client $ACME_ID, secret $ACME_SECRET), scopes payouts refunds"},
		{"hmac", ", auth: {type: hmac, secret_env: ACME_SECRET}", nil, "hmac-sha256 in X-Signature (hex) with X-Timestamp, key from $ACME_SECRET"},
		{"hmac in base64", ", auth: {type: hmac, secret_env: ACME_SECRET, signature_header: Signature, timestamp_header: Signature-Time, encoding: base64}", nil,
			"hmac-sha256 in Signature (base64) with Signature-Time, key from $ACME_SECRET"},
		{"an unknown type", ", auth: {type: basic}", []string{`providers.acme.auth.type: must be header, oauth2 or hmac, got "basic"`}, ""},
		{"another type's keys", ", auth: {type: header, secret_env: ACME_SECRET, token_url: 'https://a/token', encoding: hex}", []string{
			"providers.acme.auth.token_url: is for type oauth2, not header",
			"providers.acme.auth.encoding: is for type hmac, not header"}, ""},
		{"oauth2 without its keys", ", auth: {type: oauth2, secret_env: X, params: {scope: all}}", []string{
			"providers.acme.auth.secret_env: is for type header or hmac, not oauth2",
			"providers.acme.auth.token_url: required: the token endpoint, an absolute http or https URL",
			"providers.acme.auth.client_id_env: required: the name of an environment variable holding the secret",
			"providers.acme.auth.client_secret_env: required: the name of an environment variable holding the secret",
			"providers.acme.auth.params.scope: is set by the grant (client_id_env, client_secret_env, scopes): leave it out"}, ""},
		{"hmac's headers", ", auth: {type: hmac, secret_env: ACME_SECRET, signature_header: Sig, timestamp_header: sig, encoding: b64}", []string{
			`providers.acme.auth.timestamp_header: must be an HTTP header name other than signature_header, got "sig"`,
			`providers.acme.auth.encoding: must be hex or base64, got "b64"`}, ""},
		{"the shorthand beside auth", ", auth_header: Authorization, auth_env: ACME_SECRET, auth: {type: header, secret_env: ACME_SECRET}", []string{
			"providers.acme.auth: auth_header and auth_env are the shorthand of auth {type: header}: use one or the other"}, ""},
		{"auth's header is the merchant's", ", merchant_header: X-Signature, auth: {type: hmac, secret_env: ACME_SECRET}", []string{
			"providers.acme.merchant_header: must differ from X-Signature, which auth sets"}, ""},
		{"a secret in the file", ", auth: {type: oauth2, token_url: 'https://a/token', client_id_env: ACME_ID, client_secret_env: ACME_SECRET, client_secret: hunter2}", []string{
			"providers.acme.auth.client_secret: unknown key; secrets never live in the file: set providers.acme.auth.client_secret_env to the name of an environment variable holding it"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := config.Load(writeFile(t, base+tt.yaml+"}}\n"))
			wantProblems(t, err, tt.want) // and never the secret, hunter2
			if tt.want != nil {
				return
			}
			if got := c.Providers["acme"].Authentication().String(); got != tt.auth {
				t.Fatalf("auth %q, want %q", got, tt.auth)
			}
		})
	}
}

// A provider's client certificate and CAs: read at load as Redis's are, refused over http://, and named
// by their keys when they fail.
func TestProviderClientCertificate(t *testing.T) {
	ca := testtls.NewCA(t)
	cert, key := ca.Client(t, "paygate")
	const base = "providers: {acme: {url: '%s', timeout: 1s, limits: [{requests: 10, per: 1s}]%s}}\n"
	c, err := config.Load(writeFile(t, fmt.Sprintf(base, "https://api.example.com", ", tls_cert_file: "+cert+", tls_key_file: "+key+", tls_ca_file: "+ca.File)))
	wantProblems(t, err, nil)
	tc, err := c.Providers["acme"].TLSConfig("acme")
	if err != nil || len(tc.Certificates) != 1 || tc.RootCAs == nil {
		t.Fatalf("tls config %+v, %v", tc, err)
	}
	if got := c.Providers["acme"].DescribeTLS(); got != " ca "+ca.File+" client certificate "+cert {
		t.Fatalf("describe: %q", got)
	}
	_, err = config.Load(writeFile(t, fmt.Sprintf(base, "http://api.example.com", ", tls_cert_file: "+cert)))
	wantProblems(t, err, []string{
		"providers.acme.tls_key_file: required with providers.acme.tls_cert_file (the client certificate's private key)",
		"providers.acme.tls_cert_file: is set, but TLS is off: url is http://"})
	if tc, err := (config.Provider{}).TLSConfig("acme"); tc != nil || err != nil {
		t.Fatalf("no files: %v %v", tc, err)
	}
}
