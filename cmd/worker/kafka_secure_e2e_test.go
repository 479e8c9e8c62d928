package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/internal/testtls"
	"github.com/paygate/paygate/providers/sim"
	"github.com/paygate/paygate/wire"
)

// End to end on a Kafka that wants what a managed cluster wants: TLS from a private CA, a client
// certificate, and SASL SCRAM-SHA-512. kfake runs in the test's process; the workers and enqueue are the
// real binary.

const (
	secureUser     = "paygate"
	securePassword = "Kafka-s3cret-Pw"
)

// secureKfake starts kfake with TLS (ca's server certificate; client certificates ca signed required)
// and SASL (secureUser with securePassword, SCRAM-SHA-512), closed when the test ends.
func secureKfake(t *testing.T, ca *testtls.CA) string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.TLS(ca.RequireClients()), kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-512", secureUser, securePassword))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()[0]
}

// useKafka points the fleet's configuration at brokers, with security's TLS and SASL keys (flow-style
// YAML, without the braces).
func (f *fleet) useKafka(brokers, security string) {
	f.t.Helper()
	b, err := os.ReadFile(f.cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	cfg := strings.Replace(string(b), fmt.Sprintf("broker: {kind: rabbitmq, rabbitmq: {exchange: %s, prefetch: 16}}", f.x),
		fmt.Sprintf("broker: {kind: kafka, kafka: {brokers: [%q], group: %s, topic_prefix: %s, partitions: 2, %s}}", brokers, f.x, f.x, security), 1)
	if err := os.WriteFile(f.cfg, []byte(cfg), 0o600); err != nil {
		f.t.Fatal(err)
	}
}

// The acceptance on a secure Kafka: `worker run` joins the group over TLS with a client
// certificate and SCRAM-SHA-512 (the password from a _FILE secret), `worker enqueue` publishes, the jobs
// are dispatched, each once, and committed (the group's lag, read by wire.Backlog as the dashboard reads
// it, falls to 0); the worker stops with status 0, and the password is in none of its logs.
func TestKafkaSecureRun(t *testing.T) {
	ca := testtls.NewCA(t)
	brokers := secureKfake(t, ca)
	cert, key := ca.Client(t, "paygate")
	windows := []sim.Window{{Limit: 20, Per: time.Second}}
	f := newFleet(t, simProvider{name: "acme", limits: windows})
	f.useKafka(brokers, fmt.Sprintf("tls: true, tls_ca_file: %s, tls_cert_file: %s, tls_key_file: %s, sasl: {mechanism: SCRAM-SHA-512, username: %s}",
		ca.File, cert, key, secureUser))
	secret := filepath.Join(t.TempDir(), "kafka-password")
	if err := os.WriteFile(secret, []byte(securePassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f.env2 = append(f.env2, "PAYGATE_KAFKA_PASSWORD=", "PAYGATE_KAFKA_PASSWORD_FILE="+secret)
	f.established()
	f.startWorker()
	f.waitFor("the worker in the group", 30*time.Second, f.inGroup)
	f.enqueue("acme", 30, "sec")
	s := f.sims["acme"]
	f.waitFor("30 accepted", 30*time.Second, func() bool { return s.Stats().Accepted >= 30 })

	// The dashboard's reader of the backlog, built as `worker dashboard` builds it.
	c, err := config.Load(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	backlog, closeBacklog, err := wire.Backlog(c, wire.Options{Secret: func(string) string { return securePassword }})
	if err != nil {
		t.Fatal(err)
	}
	defer closeBacklog()
	f.waitFor("every record committed", 10*time.Second, func() bool {
		lag, err := backlog(context.Background())
		n, ok := lag["acme"]
		return err == nil && ok && n == 0
	})
	f.stopAll()
	st := s.Stats()
	if st.Accepted != 30 || st.Duplicates != 0 || st.Violations != 0 || st.BadRequests != 0 {
		f.dumpLogs()
		t.Fatalf("stats %+v", st)
	}
	logs, _ := filepath.Glob(filepath.Join(f.dir, "worker-*.log"))
	for _, l := range logs {
		if b, _ := os.ReadFile(l); strings.Contains(string(b), securePassword) {
			t.Fatalf("%s shows the Kafka password", filepath.Base(l))
		}
	}
}

// What only the brokers can refuse stops `worker run`, `worker enqueue` and `worker dashboard` at start: status 2, within 5 s,
// one line naming the setting to fix, and never the password.
func TestKafkaSecureRefusals(t *testing.T) {
	ca, other := testtls.NewCA(t), testtls.NewCA(t)
	brokers := secureKfake(t, ca)
	cert, key := ca.Client(t, "paygate")
	security := func(caFile, cert, key string) string {
		s := "tls: true, tls_ca_file: " + caFile
		if cert != "" {
			s += ", tls_cert_file: " + cert + ", tls_key_file: " + key
		}
		return s + ", sasl: {mechanism: SCRAM-SHA-512, username: " + secureUser + "}"
	}
	tests := []struct {
		name     string
		security string
		password string
		want     string // the line's start, after "worker: "
	}{
		{"a wrong password", security(ca.File, cert, key), "hunter2",
			`broker.kafka.sasl: the brokers refused user "paygate" with SCRAM-SHA-512 (password from $PAYGATE_KAFKA_PASSWORD): kafka: SASL authentication refused: `},
		{"an untrusted certificate", security(other.File, cert, key), securePassword,
			"broker.kafka.tls_ca_file: the broker's certificate does not verify against " + other.File + ": kafka: the broker's certificate is not trusted: "},
		{"no client certificate", security(ca.File, "", ""), securePassword,
			"broker.kafka.tls_cert_file: the broker wants a client certificate (set tls_cert_file and tls_key_file): kafka: the broker refused the client certificate: "},
		{"the password unset", security(ca.File, cert, key), "",
			`broker.kafka.sasl.password_env: environment variable PAYGATE_KAFKA_PASSWORD is not set (nor PAYGATE_KAFKA_PASSWORD_FILE): the password of user "paygate"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFleet(t, simProvider{name: "acme", limits: []sim.Window{{Limit: 5, Per: time.Second}}})
			f.useKafka(brokers, tt.security)
			env := []string{"PAYGATE_KAFKA_PASSWORD=" + tt.password, "PAYGATE_KAFKA_PASSWORD_FILE="}
			for _, args := range [][]string{
				{"run", "--config", f.cfg},
				{"enqueue", "--config", f.cfg, "--provider", "acme", "--count", "1"},
				{"dashboard", "--config", f.cfg, "--listen", "127.0.0.1:0"},
			} {
				start := time.Now()
				r := worker(t, env, args...)
				took := time.Since(start)
				lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
				last := lines[len(lines)-1]
				if r.code != 2 || !strings.HasPrefix(last, "worker: "+tt.want) || took > 5*time.Second {
					t.Fatalf("%s: status %d after %s, last line:\n%s\nwant status 2 within 5s, starting:\nworker: %s", args[0], r.code, took, last, tt.want)
				}
				if strings.Contains(r.stderr+r.stdout, "hunter2") || strings.Contains(r.stderr+r.stdout, securePassword) {
					t.Fatalf("%s shows the password:\n%s", args[0], r.stderr)
				}
				t.Logf("%s: status 2 after %s: %s", args[0], took.Round(time.Millisecond), last)
			}
		})
	}
}

// check-config shows Kafka's TLS and SASL settings and whether the password's variable is set, never the
// password.
func TestKafkaSecureCheckConfig(t *testing.T) {
	ca := testtls.NewCA(t)
	cert, key := ca.Client(t, "paygate")
	f := newFleet(t, simProvider{name: "acme", limits: []sim.Window{{Limit: 5, Per: time.Second}}})
	f.useKafka("kafka.example.com:9096", fmt.Sprintf("tls: true, tls_ca_file: %s, tls_cert_file: %s, tls_key_file: %s, sasl: {mechanism: SCRAM-SHA-512, username: %s}",
		ca.File, cert, key, secureUser))
	for _, tt := range []struct{ password, want string }{{securePassword, "(set)"}, {"", "(not set)"}} {
		r := worker(t, []string{"PAYGATE_KAFKA_PASSWORD=" + tt.password, "PAYGATE_KAFKA_PASSWORD_FILE="}, "check-config", "--config", f.cfg)
		want := fmt.Sprintf(`broker: kafka kafka.example.com:9096, group %q, topic prefix %q, tls ca %s client certificate %s, sasl SCRAM-SHA-512 user "paygate", password from $PAYGATE_KAFKA_PASSWORD %s`,
			f.x, f.x, ca.File, cert, tt.want)
		if r.code != 0 || !strings.Contains(r.stdout, want+"\n") || strings.Contains(r.stdout+r.stderr, securePassword) {
			t.Fatalf("status %d, stdout:\n%s\nstderr:\n%s\nwant the line:\n%s", r.code, r.stdout, r.stderr, want)
		}
	}
}
