package config_test

import (
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/internal/testtls"
)

const oneProvider = "providers: {acme: {url: 'http://127.0.0.1:8081/payments', timeout: 1s, limits: [{requests: 1, per: 1s}]}}\n"

// TLS settings that cannot work are refused with their path, and never with a credential.
func TestTLSValidation(t *testing.T) {
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing.pem")
	ca := testtls.NewCA(t)
	cert, key := ca.Client(t, "worker")
	_, otherKey := ca.Client(t, "other")
	tests := []struct {
		name string
		yaml string
		want []string // every line, in order
	}{
		{"bad scheme", "redis: {addrs: ['http://10.0.0.1:6379']}", []string{
			`redis.addrs[0]: must be host:port, redis://host:port or rediss://host:port, got "http://10.0.0.1:6379"`}},
		{"a database in the URL", "redis: {addrs: ['rediss://10.0.0.1:6379/2']}", []string{
			`redis.addrs[0]: must be host:port, redis://host:port or rediss://host:port, got "rediss://10.0.0.1:6379/2"`}},
		{"no port", "redis: {addrs: ['rediss://10.0.0.1']}", []string{
			`redis.addrs[0]: must be rediss://host:port with a port 1..65535, got "rediss://10.0.0.1"`}},
		{"credentials in the URL", "redis: {addrs: ['rediss://app:hunter2@10.0.0.1:6379']}", []string{
			`redis.addrs[0]: credentials never live in an address: set redis.username, and redis.password_env to the name of an environment variable holding the password`}},
		{"mixed schemes", "redis: {addrs: ['rediss://10.0.0.1:6379', '10.0.0.2:6379']}", []string{
			`redis.addrs: mixes rediss://, redis:// and bare host:port; write every address alike`}},
		{"tls with redis://", "redis: {tls: true, addrs: ['redis://10.0.0.1:6379']}", []string{
			`redis.tls: is true, but redis.addrs says redis:// (plaintext); use rediss:// or drop the scheme`}},
		{"a CA without TLS", "redis: {tls_ca_file: " + missing + "}", []string{
			`redis.tls_ca_file: is set, but TLS is off: set redis.tls: true or use rediss:// addresses`}},
		{"a missing CA file", "redis: {tls: true, tls_ca_file: " + missing + "}", []string{
			`redis.tls_ca_file: cannot read the CA file: open ` + missing + `: no such file or directory`}},
		{"no certificate in the CA file", "redis: {addrs: ['rediss://10.0.0.1:6379'], tls_ca_file: " + notPEM + "}", []string{
			`redis.tls_ca_file: no PEM certificate in ` + notPEM}},
		{"broker CA file", "broker: {rabbitmq: {tls_ca_file: " + notPEM + "}}", []string{
			`broker.rabbitmq.tls_ca_file: no PEM certificate in ` + notPEM}},
		{"broker CA file, kafka", "broker: {kind: kafka, rabbitmq: {tls_ca_file: " + notPEM + "}}", nil},
		{"a client certificate", "redis: {tls: true, tls_cert_file: " + cert + ", tls_key_file: " + key + "}", nil},
		{"a client certificate without its key", "redis: {tls: true, tls_cert_file: " + cert + "}", []string{
			`redis.tls_key_file: required with redis.tls_cert_file (the client certificate's private key)`}},
		{"a key without its certificate", "redis: {addrs: ['rediss://10.0.0.1:6379'], tls_key_file: " + key + "}", []string{
			`redis.tls_cert_file: required with redis.tls_key_file (the certificate of that key)`}},
		{"a client certificate without TLS", "redis: {tls_cert_file: " + cert + ", tls_key_file: " + key + "}", []string{
			`redis.tls_cert_file: is set, but TLS is off: set redis.tls: true or use rediss:// addresses`,
			`redis.tls_key_file: is set, but TLS is off: set redis.tls: true or use rediss:// addresses`}},
		{"a key without TLS", "redis: {addrs: ['redis://10.0.0.1:6379'], tls_key_file: " + key + "}", []string{
			`redis.tls_key_file: is set, but TLS is off: set redis.tls: true or use rediss:// addresses`}},
		{"an unreadable client certificate", "redis: {tls: true, tls_cert_file: " + missing + ", tls_key_file: " + key + "}", []string{
			`redis.tls_cert_file: cannot read the client certificate: open ` + missing + `: no such file or directory`}},
		{"an unreadable key", "redis: {tls: true, tls_cert_file: " + cert + ", tls_key_file: " + missing + "}", []string{
			`redis.tls_key_file: cannot read the private key: open ` + missing + `: no such file or directory`}},
		{"not a key", "redis: {tls: true, tls_cert_file: " + cert + ", tls_key_file: " + notPEM + "}", []string{
			`redis.tls_cert_file: ` + cert + ` and ` + notPEM + ` (redis.tls_key_file) are not a PEM certificate and its private key: tls: failed to find any PEM data in key input`}},
		{"another certificate's key", "redis: {tls: true, tls_ca_file: " + ca.File + ", tls_cert_file: " + cert + ", tls_key_file: " + otherKey + "}", []string{
			`redis.tls_cert_file: ` + cert + ` and ` + otherKey + ` (redis.tls_key_file) are not a PEM certificate and its private key: tls: private key does not match public key`}},
		{"a CA and a client certificate, both wrong", "redis: {tls: true, tls_ca_file: " + notPEM + ", tls_cert_file: " + cert + "}", []string{
			`redis.tls_ca_file: no PEM certificate in ` + notPEM,
			`redis.tls_key_file: required with redis.tls_cert_file (the client certificate's private key)`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Load(writeFile(t, tt.yaml+"\n"+oneProvider))
			wantProblems(t, err, tt.want)
		})
	}
}

// rediss:// turns TLS on and loses its scheme on the way to go-redis; redis:// and bare addresses are
// plain unless redis.tls says otherwise; the CA file's certificates become the only roots.
func TestRedisTLSOptions(t *testing.T) {
	ca := testtls.NewCA(t)
	tests := []struct {
		name    string
		yaml    string
		addrs   []string
		tls     bool
		private bool // RootCAs from the CA file
		desc    string
	}{
		{"bare", "redis: {addrs: ['10.0.0.1:6379']}", []string{"10.0.0.1:6379"}, false, false, "single 10.0.0.1:6379"},
		{"redis://", "redis: {addrs: ['redis://10.0.0.1:6379']}", []string{"10.0.0.1:6379"}, false, false, "single redis://10.0.0.1:6379"},
		{"redis.tls", "redis: {tls: true, addrs: ['10.0.0.1:6379']}", []string{"10.0.0.1:6379"}, true, false, "single 10.0.0.1:6379 tls"},
		{"rediss://", "redis: {addrs: ['rediss://10.0.0.1:6379', 'rediss://10.0.0.2:6379']}", []string{"10.0.0.1:6379", "10.0.0.2:6379"}, true, false,
			"cluster rediss://10.0.0.1:6379,rediss://10.0.0.2:6379 tls"},
		{"rediss:// with a CA", "redis: {addrs: ['rediss://[::1]:6379'], tls_ca_file: " + ca.File + "}", []string{"[::1]:6379"}, true, true,
			"single rediss://[::1]:6379 tls ca " + ca.File},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := config.Load(writeFile(t, tt.yaml+"\n"+oneProvider))
			if err != nil {
				t.Fatal(err)
			}
			o, err := c.Redis.Options()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(o.Addrs, tt.addrs) || (o.TLSConfig != nil) != tt.tls || c.Redis.TLSEnabled() != tt.tls {
				t.Fatalf("addrs %v, tls %v; want %v, %v", o.Addrs, o.TLSConfig != nil, tt.addrs, tt.tls)
			}
			if tt.tls && (o.TLSConfig.MinVersion < tls.VersionTLS12 || (o.TLSConfig.RootCAs != nil) != tt.private || o.TLSConfig.InsecureSkipVerify) {
				t.Fatalf("tls config %+v", o.TLSConfig)
			}
			if s := c.Redis.String(); s != tt.desc {
				t.Fatalf("description %q, want %q", s, tt.desc)
			}
		})
	}
	// The CA file is read again when the client is built: a file gone since Load is an error naming the key.
	c, err := config.Load(writeFile(t, "redis: {tls: true}\n"+oneProvider))
	if err != nil {
		t.Fatal(err)
	}
	c.Redis.TLSCAFile = filepath.Join(t.TempDir(), "gone.pem")
	if _, err := c.Redis.Options(); err == nil || !strings.HasPrefix(err.Error(), "config: redis.tls_ca_file: cannot read the CA file: open ") {
		t.Fatalf("a vanished CA file: %v", err)
	}
}

// broker.rabbitmq.tls_ca_file gives a TLS configuration trusting only that CA; without it, none (amqp091-go's
// default for amqps://).
func TestRabbitMQTLSConfig(t *testing.T) {
	ca := testtls.NewCA(t)
	c, err := config.Load(writeFile(t, "broker: {rabbitmq: {tls_ca_file: "+ca.File+"}}\n"+oneProvider))
	if err != nil {
		t.Fatal(err)
	}
	tc, err := c.Broker.RabbitMQ.TLSConfig()
	if err != nil || tc == nil || tc.RootCAs == nil || tc.MinVersion < tls.VersionTLS12 {
		t.Fatalf("tls config %+v %v", tc, err)
	}
	c.Broker.RabbitMQ.TLSCAFile = ""
	if tc, err := c.Broker.RabbitMQ.TLSConfig(); tc != nil || err != nil {
		t.Fatalf("without a CA file: %+v %v", tc, err)
	}
}

// wantProblems checks that err lists exactly want (nil: no error), and that no error shows the test's
// password (hunter2).
func wantProblems(t *testing.T, err error, want []string) {
	t.Helper()
	if want == nil {
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	var ve *config.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("want a *ValidationError, got %v", err)
	}
	if !reflect.DeepEqual(ve.Problems, want) {
		t.Fatalf("problems:\n%s\nwant:\n%s", strings.Join(ve.Problems, "\n"), strings.Join(want, "\n"))
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("the error shows the password: %v", err)
	}
}
