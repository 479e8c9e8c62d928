package main

import (
	"context"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/internal/testenv"
	"github.com/paygate/paygate/internal/testtls"
	"github.com/paygate/paygate/providers/sim"
)

// enqueue and a worker process reach Redis through rediss:// and RabbitMQ through amqps://, each
// trusting only the test's CA, and take jobs through to a provider. The servers are the real ones behind
// TLS proxies, so every byte between the processes and them crossed a verified handshake.
func TestRunOverTLS(t *testing.T) { runOverTLS(t, false) }

// As TestRunOverTLS, behind proxies that require a client certificate the CA signed (Redis's
// tls-auth-clients, RabbitMQ's verify_peer with fail_if_no_peer_cert): the processes present the ones
// redis.tls_cert_file/tls_key_file and broker.rabbitmq.tls_cert_file/tls_key_file name, set from the
// environment.
func TestRunOverMutualTLS(t *testing.T) { runOverTLS(t, true) }

func runOverTLS(t *testing.T, mutual bool) {
	f := newFleet(t, simProvider{name: "acme", limits: []sim.Window{{Limit: 100, Per: time.Second}}})
	ca := testtls.NewCA(t)
	server := ca.Server
	if mutual {
		server = ca.RequireClients()
	}
	redisProxy := testtls.ProxyWith(t, testenv.RedisAddr(), server)
	u, err := url.Parse(testenv.AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	amqpProxy := testtls.ProxyWith(t, u.Host, server)
	u.Scheme, u.Host = "amqps", amqpProxy.Addr
	f.env2 = []string{"PAYGATE_REDIS_ADDRS=rediss://" + redisProxy.Addr, "PAYGATE_REDIS_TLS_CA_FILE=" + ca.File,
		"PAYGATE_AMQP_URL=" + u.String(), "PAYGATE_BROKER_RABBITMQ_TLS_CA_FILE=" + ca.File}
	startLine := "rediss://" + redisProxy.Addr + " tls ca " + ca.File
	refusal := "broker.rabbitmq.tls_ca_file: is set, but $PAYGATE_AMQP_URL is not an amqps:// URL"
	if mutual {
		redisCert, redisKey := ca.Client(t, "paygate-redis")
		amqpCert, amqpKey := ca.Client(t, "paygate-amqp")
		f.env2 = append(f.env2, "PAYGATE_REDIS_TLS_CERT_FILE="+redisCert, "PAYGATE_REDIS_TLS_KEY_FILE="+redisKey,
			"PAYGATE_BROKER_RABBITMQ_TLS_CERT_FILE="+amqpCert, "PAYGATE_BROKER_RABBITMQ_TLS_KEY_FILE="+amqpKey)
		startLine += " client certificate " + redisCert
		refusal = "broker.rabbitmq.tls_ca_file, broker.rabbitmq.tls_cert_file, broker.rabbitmq.tls_key_file: are set, but $PAYGATE_AMQP_URL is not an amqps:// URL"
	}
	f.enqueue("acme", 20, "tls")
	f.startWorker()
	s := f.sims["acme"]
	f.waitFor("20 accepted", 60*time.Second, func() bool { return s.Stats().Accepted >= 20 })
	f.stopAll()
	if st := s.Stats(); st.Accepted != 20 || st.Violations != 0 || st.BadRequests != 0 {
		t.Fatalf("provider saw %+v", st)
	}
	// enqueue's two AMQP connections and the worker's two; the gate's pool.
	if amqpProxy.Forwarded() < 4 || redisProxy.Forwarded() < 1 || amqpProxy.Refused()+redisProxy.Refused() != 0 {
		t.Fatalf("through the proxies: amqp %d (refused %d), redis %d (refused %d)",
			amqpProxy.Forwarded(), amqpProxy.Refused(), redisProxy.Forwarded(), redisProxy.Refused())
	}
	log, err := os.ReadFile(filepath.Join(f.dir, "worker-0.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), startLine) {
		t.Fatalf("the worker's start line does not say %q:\n%s", startLine, log)
	}

	// The TLS files are for amqps:// only: with a plain URL the worker refuses to start (exit 2), naming the keys.
	u.Scheme = "amqp"
	f.env2 = append(f.env2, "PAYGATE_AMQP_URL="+u.String())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // were it to start, it would run on
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "run", "--config", f.cfg)
	cmd.Env = append(os.Environ(), f.env2...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), refusal) {
		t.Fatalf("amqp:// with TLS files: %v, output %s", err, out)
	}
}
