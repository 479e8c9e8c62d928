package config_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/testtls"
)

// The gate works with a real redis-server that requires client certificates (tls-auth-clients yes) when
// redis.tls_cert_file and tls_key_file name one the server's CA signed; without them the handshake is
// refused, and the gate's error says so.
func TestRedisClientCertificate(t *testing.T) {
	ca := testtls.NewCA(t)
	addr := startTLSRedis(t, ca)
	cert, key := ca.Client(t, "paygate-worker")
	policies := map[string]gate.Provider{"acme": {Policies: []gate.Policy{{Limit: 2, Window: time.Minute}}}}
	limiter := func(t *testing.T, yaml string) (*gate.Limiter, *config.Config) {
		t.Helper()
		c, err := config.Load(writeFile(t, yaml+"\n"+oneProvider))
		if err != nil {
			t.Fatal(err)
		}
		o, err := c.Redis.Options()
		if err != nil {
			t.Fatal(err)
		}
		rdb := redis.NewUniversalClient(o)
		t.Cleanup(func() { rdb.Close() })
		l, err := gate.New(rdb, gate.Options{Prefix: c.Redis.KeyPrefix, Providers: policies})
		if err != nil {
			t.Fatal(err)
		}
		return l, c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	t.Run("with the client certificate", func(t *testing.T) {
		l, c := limiter(t, "redis: {addrs: ['rediss://"+addr+"'], tls_ca_file: "+ca.File+", tls_cert_file: "+cert+", tls_key_file: "+key+"}")
		if want := "single rediss://" + addr + " tls ca " + ca.File + " client certificate " + cert; c.Redis.String() != want {
			t.Fatalf("description %q, want %q", c.Redis.String(), want)
		}
		for i, id := range []string{"pay-1", "pay-2", "pay-3"} {
			v, err := l.Reserve(ctx, "acme", id, 1, 0)
			if err != nil {
				t.Fatal(err)
			}
			if want := i < 2; v.Allowed != want || v.Duplicate {
				t.Fatalf("%s allowed %v duplicate %v, want allowed %v (2 per minute)", id, v.Allowed, v.Duplicate, want)
			}
		}
	})
	t.Run("without it", func(t *testing.T) {
		l, _ := limiter(t, "redis: {addrs: ['rediss://"+addr+"'], tls_ca_file: "+ca.File+"}")
		_, err := l.Reserve(ctx, "acme", "pay-1", 1, 0)
		if err == nil || !strings.HasPrefix(err.Error(), "gate: reserve acme/pay-1: ") || !refusal.MatchString(err.Error()) {
			t.Fatalf("got %v, want the gate's error with the server's refusal", err)
		}
		t.Logf("the gate without a client certificate: %v", err)
		// The server's reason, read before anything is written: under TLS 1.3 the client's handshake ends
		// before the server checks its certificate, so the refusal comes on the first read.
		if err := firstRead(addr, ca); err == nil || !strings.Contains(err.Error(), "remote error: tls: certificate required") {
			t.Fatalf("a handshake without a client certificate, then a read: %v, want the server's certificate required", err)
		}
	})
}

// refusal is how a connection the server refused for want of a client certificate fails. Under TLS 1.3
// the client's handshake ends before the server has checked, and the server's alert (certificate required)
// comes on the first read; a client that writes at once, as go-redis and amqp091-go do, may find the
// connection reset instead, the alert lost with it.
var refusal = regexp.MustCompile(`tls: certificate required|connection reset by peer|broken pipe`)

// firstRead handshakes with addr trusting ca, without a client certificate, and reads.
func firstRead(addr string, ca *testtls.CA) error {
	pem, err := os.ReadFile(ca.File)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12})
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1))
	return err
}

// startTLSRedis starts a redis-server of its own, listening only for TLS on a free loopback port, with a
// certificate of ca and requiring client certificates that ca signed; it stops when the test ends. The
// test is skipped when redis-server is missing, or built without TLS.
func startTLSRedis(t *testing.T, ca *testtls.CA) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not installed")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	certFile, keyFile := ca.ServerFiles(t)
	dir := t.TempDir()
	cmd := exec.Command(bin, "--port", "0", "--bind", "127.0.0.1", "--tls-port", strconv.Itoa(port),
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", ca.File,
		"--tls-auth-clients", "yes", "--save", "", "--appendonly", "no", "--dir", dir, "--logfile", "")
	out, err := os.Create(filepath.Join(dir, "redis.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		killed := <-exited // its exit error says it was killed, and nothing else
		_ = killed
		out.Close()
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	waitTLSRedis(t, addr, ca, exited, filepath.Join(dir, "redis.log"))
	return addr
}

// noTLS is what a redis-server built without TLS says at start: before 7.2 the tls-* options are unknown
// ("Bad directive" after the line that set them); from 7.2 the tls connection type is missing.
var noTLS = regexp.MustCompile(`(?is)tls-port.*bad directive|connection listener of tls|connection type tls not builtin`)

// waitTLSRedis waits until a handshake with a client certificate of ca succeeds at addr, skipping the test
// when the server exited saying it has no TLS.
func waitTLSRedis(t *testing.T, addr string, ca *testtls.CA, exited <-chan error, logFile string) {
	t.Helper()
	cert, key := ca.Client(t, "probe")
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(writeFile(t, "redis: {addrs: ['rediss://"+addr+"'], tls_ca_file: "+ca.File+"}\n"+oneProvider))
	if err != nil {
		t.Fatal(err)
	}
	o, err := c.Redis.Options()
	if err != nil {
		t.Fatal(err)
	}
	o.TLSConfig.Certificates = []tls.Certificate{pair}
	o.MaxRetries = -1
	rdb := redis.NewUniversalClient(o)
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(logFile)
			if noTLS.Match(log) {
				t.Skipf("redis-server has no TLS support: %s", log)
			}
			t.Fatalf("redis-server exited: %v\n%s", err, log)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logFile)
			t.Fatalf("redis-server at %s not ready within 10s: %v\n%s", addr, err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The client certificate reaches every TLS configuration built from the keys, and the environment sets
// the keys as it does every other: Redis's with TLS on, RabbitMQ's with or without a CA file (without
// one: the system's roots).
func TestClientCertificateConfigs(t *testing.T) {
	ca := testtls.NewCA(t)
	cert, key := ca.Client(t, "worker")
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("PAYGATE_REDIS_TLS_CERT_FILE", cert)
	t.Setenv("PAYGATE_REDIS_TLS_KEY_FILE", key)
	t.Setenv("PAYGATE_BROKER_RABBITMQ_TLS_CERT_FILE", cert)
	t.Setenv("PAYGATE_BROKER_RABBITMQ_TLS_KEY_FILE", key)
	c, err := config.Load(writeFile(t, "redis: {addrs: ['rediss://10.0.0.1:6379']}\n"+oneProvider))
	if err != nil {
		t.Fatal(err)
	}
	if u := c.UnknownEnv(os.Environ()); len(u) != 0 {
		t.Fatalf("unknown variables %v", u)
	}
	presents := func(what string, tc *tls.Config, private bool) {
		t.Helper()
		if tc == nil || len(tc.Certificates) != 1 || !pair.Leaf.Equal(tc.Certificates[0].Leaf) ||
			(tc.RootCAs != nil) != private || tc.MinVersion < tls.VersionTLS12 || tc.InsecureSkipVerify {
			t.Fatalf("%s: tls config %+v", what, tc)
		}
	}
	o, err := c.Redis.Options()
	if err != nil {
		t.Fatal(err)
	}
	presents("redis", o.TLSConfig, false)
	if want := "single rediss://10.0.0.1:6379 tls client certificate " + cert; c.Redis.String() != want {
		t.Fatalf("description %q, want %q", c.Redis.String(), want)
	}
	r := c.Broker.RabbitMQ
	tc, err := r.TLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	presents("rabbitmq without a CA file", tc, false)
	r.TLSCAFile = ca.File
	tc, err = r.TLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	presents("rabbitmq with a CA file", tc, true)
}

// broker.rabbitmq's client certificate is read as Redis's and Kafka's are: both or neither, a readable
// pair, the errors naming the keys and files, never the key. Set, its keys refuse an AMQP URL that is not
// amqps://, naming the keys and the variable, never the URL.
func TestRabbitMQClientCertificate(t *testing.T) {
	ca := testtls.NewCA(t)
	cert, key := ca.Client(t, "worker")
	_, otherKey := ca.Client(t, "other")
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, tt := range []struct {
		name string
		r    config.RabbitMQ
		want string
	}{
		{"no key", config.RabbitMQ{TLSCertFile: cert},
			"broker.rabbitmq.tls_key_file: required with broker.rabbitmq.tls_cert_file (the client certificate's private key)"},
		{"no certificate", config.RabbitMQ{TLSCAFile: ca.File, TLSKeyFile: key},
			"broker.rabbitmq.tls_cert_file: required with broker.rabbitmq.tls_key_file (the certificate of that key)"},
		{"unreadable", config.RabbitMQ{TLSCertFile: missing, TLSKeyFile: key},
			"broker.rabbitmq.tls_cert_file: cannot read the client certificate: open " + missing + ": no such file or directory"},
		{"not a pair", config.RabbitMQ{TLSCertFile: cert, TLSKeyFile: otherKey},
			"broker.rabbitmq.tls_cert_file: " + cert + " and " + otherKey +
				" (broker.rabbitmq.tls_key_file) are not a PEM certificate and its private key: tls: private key does not match public key"},
	} {
		tc, err := tt.r.TLSConfig()
		if tc != nil || err == nil || err.Error() != tt.want {
			t.Errorf("%s: %v, want %s", tt.name, err, tt.want)
		}
	}
	for _, tt := range []struct {
		name, url string
		r         config.RabbitMQ
		want      string
	}{
		{"no TLS keys", "amqp://h/", config.RabbitMQ{URLEnv: "PAYGATE_AMQP_URL"}, ""},
		{"amqps", "amqps://u:hunter2@h/", config.RabbitMQ{URLEnv: "PAYGATE_AMQP_URL", TLSCertFile: cert, TLSKeyFile: key}, ""},
		{"AMQPS", "AMQPS://u:hunter2@h/", config.RabbitMQ{URLEnv: "PAYGATE_AMQP_URL", TLSCAFile: ca.File}, ""},
		{"a CA file", "amqp://u:hunter2@h/", config.RabbitMQ{URLEnv: "PAYGATE_AMQP_URL", TLSCAFile: ca.File},
			"broker.rabbitmq.tls_ca_file: is set, but $PAYGATE_AMQP_URL is not an amqps:// URL"},
		{"a client certificate", "amqp://u:hunter2@h/", config.RabbitMQ{URLEnv: "AMQP", TLSCertFile: cert, TLSKeyFile: key},
			"broker.rabbitmq.tls_cert_file, broker.rabbitmq.tls_key_file: are set, but $AMQP is not an amqps:// URL"},
	} {
		err := tt.r.CheckTLSURL(tt.url)
		if (err == nil) != (tt.want == "") || (err != nil && err.Error() != tt.want) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
}
