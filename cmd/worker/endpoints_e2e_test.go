package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/internal/testtls"
	"github.com/paygate/paygate/providers/sim"
)

// Issue 43's acceptance: endpoints under one budget, OAuth2, HMAC and client certificates, through worker
// processes on RabbitMQ against provider-sim.

// addToProvider appends YAML lines under the fleet's last provider (its keys' indentation, 4 spaces).
func (f *fleet) addToProvider(lines ...string) {
	f.t.Helper()
	fh, err := os.OpenFile(f.cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = fh.WriteString("    " + strings.Join(lines, "\n    ") + "\n")
		fh.Close()
	}
	if err != nil {
		f.t.Fatal(err)
	}
}

// enqueueLines publishes the jobs of a JSON-lines file through worker enqueue --file, which checks each
// as the workers will.
func (f *fleet) enqueueLines(lines []string) {
	f.t.Helper()
	file := filepath.Join(f.dir, fmt.Sprintf("jobs-%d.jsonl", time.Now().UnixNano()))
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		f.t.Fatal(err)
	}
	r := worker(f.t, f.env()[len(os.Environ()):], "enqueue", "--config", f.cfg, "--file", file)
	if r.code != 0 {
		f.t.Fatalf("enqueue --file: exit %d %s%s", r.code, r.stdout, r.stderr)
	}
}

// deadLetters drains the dead-letter queue: each message's x-paygate-reason and x-paygate-error.
func (f *fleet) deadLetters() (reasons, errs []string) {
	f.t.Helper()
	for _, m := range f.drain(f.x + ".dead") {
		reasons = append(reasons, fmt.Sprint(m.Headers["x-paygate-reason"]))
		errs = append(errs, fmt.Sprint(m.Headers["x-paygate-error"]))
	}
	return reasons, errs
}

// workerOutput is every worker's log and the dead letters' errors, for the secrets' checks.
func (f *fleet) workerOutput(dead []string) string {
	logs, _ := filepath.Glob(filepath.Join(f.dir, "worker-*.log"))
	out := strings.Join(dead, "\n")
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		out += "\n" + string(b)
	}
	return out
}

// Three endpoints and the provider's url under one budget of 30/1s, jobs mixed across them, two worker
// processes: 0 over the limit counted across the paths, every request on the path its job named, the
// placeholders filled and escaped (ids with '/' and spaces, a payload field); an unknown operation and a
// placeholder a job cannot fill are dead letters naming them.
func TestEndpointsShareOneBudget(t *testing.T) {
	windows := []sim.Window{{Limit: 30, Per: time.Second}}
	f := newFleet(t, simProvider{name: "acme", limits: windows})
	f.margin = 30 * time.Millisecond
	f.addToProvider("endpoints:",
		"  payouts: {path: /v1/payouts}",
		"  refunds: {path: '/v1/payments/{payload.payment_id}/refunds', cost: 2}",
		"  status: {method: get, path: '/v1/payouts/{id}?merchant={merchant}'}")
	const each = 40 // of four kinds: 40 + 40 x 2 + 40 + 40 = 200 units, about 7s at 30/s
	var lines []string
	paths := map[string]int64{"/pay": each, "/pay/v1/payouts": each} // url is <sim>/pay
	for i := range each {
		lines = append(lines,
			fmt.Sprintf(`{"id":"plain-%d","provider":"acme","amount":100,"currency":"EUR"}`, i),
			fmt.Sprintf(`{"id":"po-%d","provider":"acme","operation":"payouts","amount":100,"currency":"EUR"}`, i),
			fmt.Sprintf(`{"id":"rf-%d","provider":"acme","operation":"refunds","amount":100,"currency":"EUR","payload":{"payment_id":"pm/%d x"}}`, i, i),
			fmt.Sprintf(`{"id":"pay %d/a b","provider":"acme","operation":"status","amount":100,"currency":"EUR","merchant":"m 1/2"}`, i))
		paths[fmt.Sprintf("/pay/v1/payments/pm%%2F%d%%20x/refunds", i)] = 1
		paths[fmt.Sprintf("/pay/v1/payouts/pay%%20%d%%2Fa%%20b?merchant=m%%201%%2F2", i)] = 1
	}
	f.enqueueLines(lines)
	f.publishRaw("acme", []byte(`{"id":"bad-op","provider":"acme","operation":"captures","amount":1,"currency":"EUR"}`))
	f.publishRaw("acme", []byte(`{"id":"bad-ph","provider":"acme","operation":"refunds","amount":1,"currency":"EUR","payload":{"payment":"x"}}`))
	f.startWorker()
	f.startWorker()
	s := f.sims["acme"]
	f.waitFor("160 accepted", 60*time.Second, func() bool { return s.Stats().Accepted >= 4*each })
	f.stopAll()
	st := s.Stats()
	t.Logf("accepted %d in %v, max in a window %d, paths %d", st.Accepted, st.LastAccepted.Sub(*st.FirstAccepted).Round(time.Millisecond), st.Windows[0].MaxInWindow, len(st.Paths))
	if st.Violations != 0 || st.Accepted != 4*each || st.Windows[0].MaxInWindow > 30 || st.BadRequests != 0 {
		t.Fatalf("stats %+v", st)
	}
	for p, n := range paths {
		if st.Paths[p] != n {
			t.Errorf("%s: %d requests, want %d", p, st.Paths[p], n)
		}
	}
	if len(st.Paths) != len(paths) {
		t.Errorf("requests on %d paths, want %d: %v", len(st.Paths), len(paths), st.Paths)
	}
	reasons, errs := f.deadLetters()
	all := strings.Join(errs, "\n")
	if len(reasons) != 2 || reasons[0] != "invalid" || reasons[1] != "invalid" || !strings.Contains(all, `operation: "captures" is not an endpoint of provider acme`) ||
		!strings.Contains(all, "payload: {payload.payment_id} in the path of operation refunds: the payload has no field payment_id") {
		t.Fatalf("dead letters %v: %s", reasons, all)
	}
}

// OAuth2 with 5s tokens over a 30s run, two worker processes: every request carries a valid token, each
// process renews its token about every 4s (not per request), nothing lost or dead; check-config names
// the auth, never the secret.
func TestOAuth2Fleet(t *testing.T) {
	const secret = "cs_e2e_5f1d"
	windows := []sim.Window{{Limit: 20, Per: time.Second}}
	f := newFleet(t, simProvider{name: "acme", limits: windows, args: []string{"--oauth2", "paygate:" + secret, "--token-ttl", "5s"}})
	f.margin = 30 * time.Millisecond
	f.addToProvider(fmt.Sprintf("auth: {type: oauth2, token_url: '%s/token', client_id_env: E2E_CLIENT_ID, client_secret_env: E2E_CLIENT_SECRET, scopes: [payouts]}", f.sims["acme"].url))
	f.env2 = []string{"E2E_CLIENT_ID=paygate", "E2E_CLIENT_SECRET=" + secret}
	const jobs = 600 // 30s at 20/s
	f.enqueue("acme", jobs, "o")
	began := time.Now()
	f.startWorker()
	f.startWorker()
	s := f.sims["acme"]
	f.waitFor("600 accepted", 90*time.Second, func() bool { return s.Stats().Accepted >= jobs })
	ran := time.Since(began)
	f.stopAll()
	st := s.Stats()
	t.Logf("accepted %d in %v; %d tokens issued, %d requests refused for their token", st.Accepted, ran.Round(time.Millisecond), st.TokensIssued, st.Unauthorized)
	// Each process renews a fifth of a token's life (1s) before it lapses: about every 4s, 8 in 30s.
	if st.Violations != 0 || st.Unauthorized != 0 || st.TokensRefused != 0 || st.TokensIssued < 10 || st.TokensIssued > 2*int64(ran/(3*time.Second))+4 {
		t.Fatalf("stats %+v", st)
	}
	l := f.collect()
	l.check(t, ids("o", jobs))
	if len(l.dead) != 0 {
		t.Fatalf("dead letters: %v", l.dead)
	}
	r := worker(t, append(f.env()[len(os.Environ()):], "PAYGATE_CONFIG="+f.cfg), "check-config")
	want := "acme: auth oauth2 client credentials from " + s.url + "/token (client $E2E_CLIENT_ID, secret $E2E_CLIENT_SECRET), scopes payouts"
	if r.code != 0 || !strings.Contains(r.stdout, want) || strings.Contains(r.stdout+r.stderr+f.workerOutput(nil), secret) {
		t.Fatalf("check-config: exit %d, want %q and never the secret:\n%s%s", r.code, want, r.stdout, r.stderr)
	}
}

// A token endpoint that refuses the client: the jobs are dead letters after worker.max_attempts, their
// error naming the token endpoint and its answer; the secret is never printed.
func TestOAuth2TokenEndpointRefuses(t *testing.T) {
	const secret = "cs_wrong_3c9a"
	f := newFleet(t, simProvider{name: "acme", limits: []sim.Window{{Limit: 50, Per: time.Second}}, args: []string{"--oauth2", "paygate:right"}})
	f.addToProvider(fmt.Sprintf("auth: {type: oauth2, token_url: '%s/token', client_id_env: E2E_CLIENT_ID, client_secret_env: E2E_CLIENT_SECRET}", f.sims["acme"].url))
	// The breaker off: open, it would hold the jobs without spending their attempts (the token endpoint's
	// failures count toward it as the provider's).
	f.env2 = []string{"E2E_CLIENT_ID=paygate", "E2E_CLIENT_SECRET=" + secret, "PAYGATE_WORKER_MAX_ATTEMPTS=2", "PAYGATE_LOG_LEVEL=debug",
		"PAYGATE_PROVIDERS_ACME_BREAKER_FAILURES=0"}
	f.enqueue("acme", 5, "r")
	f.startWorker()
	var reasons, errs []string
	f.waitFor("5 dead letters", 30*time.Second, func() bool {
		r, e := f.deadLetters()
		reasons, errs = append(reasons, r...), append(errs, e...)
		return len(reasons) >= 5
	})
	f.stopAll()
	st := f.sims["acme"].Stats()
	want := "token endpoint " + f.sims["acme"].url + "/token: answered 401: invalid_client"
	for i, e := range errs {
		if reasons[i] != "attempts-exhausted" || !strings.Contains(e, want) {
			t.Errorf("dead letter %s: %s, want attempts-exhausted naming %q", reasons[i], e, want)
		}
	}
	if st.Requests != 0 || st.TokensRefused < 10 || strings.Contains(f.workerOutput(errs), secret) {
		t.Fatalf("stats %+v; or the secret printed", st)
	}
}

// HMAC: every request of a provider signed with the right key verifies (on paths with escaped ids); a
// provider whose key is wrong is answered 401, and its jobs are dead letters naming the signature.
func TestHMACFleet(t *testing.T) {
	windows := []sim.Window{{Limit: 50, Per: time.Second}}
	f := newFleet(t, simProvider{name: "alpha", limits: windows, args: []string{"--hmac-secret", "whsec_alpha"}},
		simProvider{name: "beta", limits: windows, args: []string{"--hmac-secret", "whsec_beta"}})
	cfg, err := os.ReadFile(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	auth := "    auth: {type: hmac, secret_env: E2E_HMAC_%s}\n    endpoints: {refunds: {path: '/r/{id}?m={idempotency_key}'}}\n"
	out := strings.Replace(string(cfg), "  beta:\n", fmt.Sprintf(auth, "ALPHA")+"  beta:\n", 1) + fmt.Sprintf(auth, "BETA")
	if err := os.WriteFile(f.cfg, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	f.env2 = []string{"E2E_HMAC_ALPHA=whsec_alpha", "E2E_HMAC_BETA=whsec_wrong"}
	var lines []string
	for i := range 30 {
		for _, p := range []string{"alpha", "beta"} {
			lines = append(lines, fmt.Sprintf(`{"id":"%s %d/x","provider":"%s","operation":"refunds","amount":1,"currency":"EUR","idempotency_key":"k&%d"}`, p, i, p, i))
		}
	}
	f.enqueueLines(lines)
	f.startWorker()
	alpha, beta := f.sims["alpha"], f.sims["beta"]
	var reasons, errs []string
	f.waitFor("alpha's 30 accepted, beta's 30 dead", 30*time.Second, func() bool {
		r, e := f.deadLetters()
		reasons, errs = append(reasons, r...), append(errs, e...)
		return alpha.Stats().Accepted >= 30 && len(reasons) >= 30
	})
	f.stopAll()
	a, b := alpha.Stats(), beta.Stats()
	if a.Accepted != 30 || a.Unauthorized != 0 || a.Paths["/pay/r/alpha%200%2Fx?m=k%260"] != 1 || b.Accepted != 0 || b.Unauthorized != 30 {
		t.Fatalf("alpha %+v\nbeta %+v", a, b)
	}
	for i, e := range errs {
		if reasons[i] != "permanent" || !strings.Contains(e, "answered 401") || !strings.Contains(e, "HMAC-SHA256 signature in X-Signature") ||
			!strings.Contains(e, "invalid signature in X-Signature") {
			t.Fatalf("dead letter %s: %s", reasons[i], e)
		}
	}
	if out := f.workerOutput(errs); strings.Contains(out, "whsec_alpha") || strings.Contains(out, "whsec_wrong") {
		t.Fatal("a key is printed")
	}
}

// A provider that requires a client certificate (provider-sim --client-ca): accepted with the one
// tls_cert_file and tls_key_file name; without it, refused, and the dead letter says the certificate was
// required.
func TestProviderClientCertificateE2E(t *testing.T) {
	ca := testtls.NewCA(t)
	certFile, keyFile := ca.ServerFiles(t)
	f := newFleet(t, simProvider{name: "acme", limits: []sim.Window{{Limit: 50, Per: time.Second}},
		args: []string{"--tls-cert", certFile, "--tls-key", keyFile, "--client-ca", ca.File}})
	s := f.sims["acme"]
	s.url = "https://" + strings.TrimPrefix(s.url, "http://")
	f.writeConfig(simProvider{name: "acme", limits: []sim.Window{{Limit: 50, Per: time.Second}}})
	clientCert, clientKey := ca.Client(t, "paygate")
	f.env2 = []string{"PAYGATE_PROVIDERS_ACME_TLS_CA_FILE=" + ca.File, "PAYGATE_PROVIDERS_ACME_TLS_CERT_FILE=" + clientCert,
		"PAYGATE_PROVIDERS_ACME_TLS_KEY_FILE=" + clientKey}
	stats := simStatsOverTLS(t, s.url, ca, clientCert, clientKey)
	f.enqueue("acme", 20, "c")
	f.startWorker()
	f.waitFor("20 accepted", 30*time.Second, func() bool { return stats().Accepted >= 20 })
	f.stopAll()

	f.env2 = []string{"PAYGATE_PROVIDERS_ACME_TLS_CA_FILE=" + ca.File, "PAYGATE_WORKER_MAX_ATTEMPTS=1", "PAYGATE_PROVIDERS_ACME_BREAKER_FAILURES=0"}
	f.enqueue("acme", 3, "n")
	f.startWorker()
	var reasons, errs []string
	f.waitFor("3 dead letters", 30*time.Second, func() bool {
		r, e := f.deadLetters()
		reasons, errs = append(reasons, r...), append(errs, e...)
		return len(reasons) >= 3
	})
	f.stopAll()
	for i, e := range errs {
		if reasons[i] != "attempts-exhausted" || !strings.Contains(e, "certificate required") {
			t.Errorf("dead letter %s: %s, want the certificate named", reasons[i], e)
		}
	}
	if st := stats(); st.Accepted != 20 || st.Requests != 20 {
		t.Fatalf("stats %+v", st)
	}
}

// simStatsOverTLS reads a TLS provider-sim's /stats with a client certificate.
func simStatsOverTLS(t *testing.T, base string, ca *testtls.CA, cert, key string) func() sim.Stats {
	pem, err := os.ReadFile(ca.File)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	cl := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}}}}
	t.Cleanup(cl.CloseIdleConnections)
	return func() sim.Stats {
		var st sim.Stats
		resp, err := cl.Get(base + "/stats")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
}

// check-config warns about each secret an auth reads, saying what it is for; never a value.
func TestAuthSecretWarnings(t *testing.T) {
	t.Setenv("E2E_SET", "s3cret")
	c := config.Default()
	c.Broker.Kind, c.Redis.PasswordEnv = "kafka", ""
	c.Providers = map[string]config.Provider{
		"bank":   {Auth: &config.Auth{Type: "oauth2", TokenURL: "https://auth.example/token", ClientIDEnv: "E2E_SET", ClientSecretEnv: "E2E_UNSET_1"}},
		"signed": {Auth: &config.Auth{Type: "hmac", SecretEnv: "E2E_UNSET_2", SignatureHeader: "X-Signature"}},
	}
	var stderr strings.Builder
	warnUnsetSecrets(&stderr, c)
	want := "worker: warning: providers.bank.auth.client_secret_env: environment variable E2E_UNSET_1 is not set (nor E2E_UNSET_1_FILE): " +
		"worker run stops at start with exit status 2 (bank's token requests carry it to https://auth.example/token)\n" +
		"worker: warning: providers.signed.auth.secret_env: environment variable E2E_UNSET_2 is not set (nor E2E_UNSET_2_FILE): " +
		"worker run stops at start with exit status 2 (signed's requests are signed with it in X-Signature)\n"
	if stderr.String() != want {
		t.Fatalf("got:\n%swant:\n%s", stderr.String(), want)
	}
}
