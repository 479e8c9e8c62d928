package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/internal/testenv"
	"github.com/paygate/paygate/providers/sim"
)

// Secrets come only from the environment, and no log line, metric or error shows them: a worker runs with
// a Redis ACL password, an AMQP password and a provider token, through accepted jobs and a malformed one;
// then the operator tools run with the same environment, and enqueue fails against a closed port with a
// password in its URL.
func TestSecretsNeverExposed(t *testing.T) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	tag := hex.EncodeToString(b[:])
	user, redisPass, amqpPass, token, hmacKey := "pg-"+tag, "R3dis-"+tag, "Amqp-"+tag, "Tok-"+tag, "Hmac-"+tag

	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer admin.Close()
	if err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">"+redisPass, "~*", "&*", "+@all").Err(); err != nil {
		t.Fatalf("redis ACL user: %v", err)
	}
	t.Cleanup(func() { admin.Do(ctx, "ACL", "DELUSER", user) })
	for _, args := range [][]string{{"add_user", user, amqpPass}, {"set_permissions", "-p", "/", user, ".*", ".*", ".*"}} {
		if out, err := exec.Command("rabbitmqctl", args...).CombinedOutput(); err != nil {
			t.Fatalf("rabbitmqctl %v: %v %s", args, err, out)
		}
	}
	t.Cleanup(func() { _ = exec.Command("rabbitmqctl", "delete_user", user).Run() })

	f := newFleet(t, simProvider{name: "acme", limits: []sim.Window{{Limit: 100, Per: time.Second}}},
		simProvider{name: "signed", limits: []sim.Window{{Limit: 100, Per: time.Second}}, args: []string{"--hmac-secret", hmacKey}})
	f.addToProvider("auth: {type: hmac, secret_env: PAYGATE_TEST_SIGNED_KEY}") // the last provider: signed
	u, err := url.Parse(testenv.AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, amqpPass)
	f.env2 = []string{
		"PAYGATE_AMQP_URL=" + u.String(),
		"PAYGATE_REDIS_USERNAME=" + user, "PAYGATE_REDIS_PASSWORD=" + redisPass,
		"PAYGATE_PROVIDERS_ACME_AUTH_HEADER=Authorization", "PAYGATE_PROVIDERS_ACME_AUTH_ENV=PAYGATE_TEST_ACME_TOKEN",
		"PAYGATE_TEST_ACME_TOKEN=Bearer " + token, "PAYGATE_TEST_SIGNED_KEY=" + hmacKey,
		"PAYGATE_LOG_LEVEL=debug",
	}
	f.startWorker()
	f.enqueue("acme", 20, "s")
	f.publishRaw("acme", []byte(`{"id":"x","provider":"acme","amount":-1,"currency":"EUR"}`))
	f.enqueue("signed", 20, "h")
	f.waitFor("20 jobs accepted", 30*time.Second, func() bool { return f.sims["acme"].Stats().Accepted >= 20 })
	f.waitFor("20 signed jobs accepted", 30*time.Second, func() bool { return f.sims["signed"].Stats().Accepted >= 20 })

	var seen []string // everything the processes said
	logs, _ := filepath.Glob(filepath.Join(f.dir, "worker-*.log"))
	for _, l := range logs {
		raw, _ := os.ReadFile(l)
		if m := regexp.MustCompile(`"http":"([^"]+)"`).FindSubmatch(raw); m != nil {
			resp, err := http.Get("http://" + string(m[1]) + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			seen = append(seen, string(body))
		}
	}
	f.stopAll()
	for _, l := range logs {
		raw, _ := os.ReadFile(l)
		seen = append(seen, string(raw))
	}
	env := append(f.env(), "PAYGATE_CONFIG="+f.cfg)
	for _, args := range [][]string{{"check-config"}, {"gate", "status", "--provider", "acme"}, {"gate", "try", "--provider", "acme"}} {
		r := worker(t, env[len(os.Environ()):], args...)
		if r.code != 0 {
			t.Fatalf("worker %v: exit %d %s", args, r.code, r.stderr)
		}
		seen = append(seen, r.stdout, r.stderr)
	}
	closed := *u
	closed.Host = "127.0.0.1:1"
	r := worker(t, append(env[len(os.Environ()):], "PAYGATE_AMQP_URL="+closed.String()), "enqueue", "--provider", "acme", "--count", "1")
	if r.code == 0 || !strings.Contains(r.stderr, "127.0.0.1:1") {
		t.Fatalf("enqueue to a closed port: exit %d, stderr %q; want a failure naming the address", r.code, r.stderr)
	}
	seen = append(seen, r.stdout, r.stderr)

	all := strings.Join(seen, "\n")
	if len(all) < 1000 || !strings.Contains(all, `"job settled"`) || !strings.Contains(all, "paygate_jobs_total") {
		t.Fatalf("too little output to judge (%d bytes)", len(all))
	}
	for name, secret := range map[string]string{"redis password": redisPass, "amqp password": amqpPass, "provider token": token, "hmac key": hmacKey} {
		if strings.Contains(all, secret) {
			i := strings.Index(all, secret)
			t.Errorf("the %s appears in the output: …%s…", name, all[max(0, i-120):min(len(all), i+40)])
		}
	}
}
