package config_test

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/internal/testtls"
)

const kafkaKind = "broker: {kind: kafka, kafka: "

// Kafka TLS and SASL settings that cannot work are refused with their paths, all at once, and never with
// a secret.
func TestKafkaSecurityValidation(t *testing.T) {
	ca := testtls.NewCA(t)
	cert, key := ca.Client(t, "paygate")
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing.pem")
	t.Setenv("KAFKA_SECRET_FILE", missing)
	tests := []struct {
		name string
		yaml string
		want []string // every line, in order; nil: valid
	}{
		{"tls with a CA and a client certificate", "{tls: true, tls_ca_file: " + ca.File + ", tls_cert_file: " + cert + ", tls_key_file: " + key + "}}", nil},
		{"sasl over tls", "{tls: true, sasl: {mechanism: SCRAM-SHA-512, username: app}}}", nil},
		{"sasl PLAIN in the environment's password", "{sasl: {mechanism: PLAIN, username: app, password_env: KAFKA_PW}}}", nil},
		{"files while tls is off", "{tls_ca_file: " + ca.File + ", tls_cert_file: " + cert + ", tls_key_file: " + key + "}}", []string{
			"broker.kafka.tls_ca_file: is set, but TLS is off: set broker.kafka.tls: true",
			"broker.kafka.tls_cert_file: is set, but TLS is off: set broker.kafka.tls: true",
			"broker.kafka.tls_key_file: is set, but TLS is off: set broker.kafka.tls: true"}},
		{"a certificate without its key", "{tls: true, tls_cert_file: " + cert + "}}", []string{
			"broker.kafka.tls_key_file: required with broker.kafka.tls_cert_file (the client certificate's private key)"}},
		{"a key without its certificate", "{tls: true, tls_key_file: " + key + "}}", []string{
			"broker.kafka.tls_cert_file: required with broker.kafka.tls_key_file (the certificate of that key)"}},
		{"unreadable files", "{tls: true, tls_ca_file: " + missing + ", tls_cert_file: " + missing + ", tls_key_file: " + key + "}}", []string{
			"broker.kafka.tls_ca_file: cannot read the CA file: open " + missing + ": no such file or directory",
			"broker.kafka.tls_cert_file: cannot read the client certificate: open " + missing + ": no such file or directory"}},
		{"an unreadable key", "{tls: true, tls_cert_file: " + cert + ", tls_key_file: " + missing + "}}", []string{
			"broker.kafka.tls_key_file: cannot read the private key: open " + missing + ": no such file or directory"}},
		{"a CA file without a certificate", "{tls: true, tls_ca_file: " + notPEM + "}}", []string{
			"broker.kafka.tls_ca_file: no PEM certificate in " + notPEM}},
		{"a key that is not a key", "{tls: true, tls_cert_file: " + cert + ", tls_key_file: " + cert + "}}", []string{
			"broker.kafka.tls_cert_file: " + cert + " and " + cert + " (broker.kafka.tls_key_file) are not a PEM certificate and its private key: tls: found a certificate rather than a key in the PEM for the private key"}},
		{"an unknown mechanism", "{sasl: {mechanism: GSSAPI, username: app}}}", []string{
			`broker.kafka.sasl.mechanism: must be PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, got "GSSAPI"`}},
		{"a mechanism in lower case", "{sasl: {mechanism: scram-sha-512, username: app}}}", []string{
			`broker.kafka.sasl.mechanism: must be PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, got "scram-sha-512"`}},
		{"a mechanism without a user", "{sasl: {mechanism: SCRAM-SHA-256}}}", []string{
			"broker.kafka.sasl.username: required with broker.kafka.sasl.mechanism SCRAM-SHA-256"}},
		{"a user without a mechanism", "{sasl: {username: app}}}", []string{
			"broker.kafka.sasl.mechanism: required with broker.kafka.sasl.username: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"}},
		{"a bad variable name", "{sasl: {mechanism: PLAIN, username: app, password_env: 'my password'}}}", []string{
			`broker.kafka.sasl.password_env: must name an environment variable, got "my password"`}},
		{"an unreadable secret file", "{sasl: {mechanism: PLAIN, username: app, password_env: KAFKA_SECRET}}}", []string{
			"broker.kafka.sasl.password_env: $KAFKA_SECRET_FILE: cannot read the secret file " + missing + ": no such file or directory"}},
		{"a password in the file", "{sasl: {mechanism: PLAIN, username: app, password: hunter2}}}", []string{
			"broker.kafka.sasl.password: unknown key; secrets never live in the file: set broker.kafka.sasl.password_env to the name of an environment variable holding it"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Load(writeFile(t, kafkaKind+tt.yaml+"\n"+oneProvider))
			if tt.want == nil || !strings.Contains(tt.want[0], "unknown key") { // on RabbitMQ, they are not looked at
				if _, err := config.Load(writeFile(t, strings.Replace(kafkaKind, "kafka,", "rabbitmq,", 1)+tt.yaml+"\n"+oneProvider)); err != nil {
					t.Fatal(err)
				}
			}
			wantProblems(t, err, tt.want)
		})
	}
}

// The TLS configuration trusts only the CA file and presents the client certificate; off, there is none.
// Security describes both without the password, saying only whether its variable is set, and the
// PAYGATE_BROKER_KAFKA_... variables override every key.
func TestKafkaSecurity(t *testing.T) {
	ca := testtls.NewCA(t)
	cert, key := ca.Client(t, "paygate")
	c, err := config.Load(writeFile(t, kafkaKind+"{tls: true, tls_ca_file: "+ca.File+", tls_cert_file: "+cert+", tls_key_file: "+key+
		", sasl: {mechanism: SCRAM-SHA-512, username: app}}}\n"+oneProvider))
	if err != nil {
		t.Fatal(err)
	}
	k := c.Broker.Kafka
	if k.SASL.PasswordEnv != "PAYGATE_KAFKA_PASSWORD" {
		t.Fatalf("password_env defaults to %q", k.SASL.PasswordEnv)
	}
	tc, err := k.TLSConfig()
	if err != nil || tc == nil || tc.RootCAs == nil || tc.MinVersion < tls.VersionTLS12 || len(tc.Certificates) != 1 || tc.InsecureSkipVerify {
		t.Fatalf("tls config %+v %v", tc, err)
	}
	want := "tls ca " + ca.File + " client certificate " + cert + `, sasl SCRAM-SHA-512 user "app", password from $PAYGATE_KAFKA_PASSWORD (not set)`
	if s := k.Security(); s != want {
		t.Fatalf("security %q, want %q", s, want)
	}
	t.Setenv("PAYGATE_KAFKA_PASSWORD", "hunter2")
	if s := k.Security(); strings.Contains(s, "hunter2") || !strings.HasSuffix(s, "(set)") {
		t.Fatalf("security with the password set: %q", s)
	}
	if unknown := c.UnknownEnv([]string{"PAYGATE_KAFKA_PASSWORD=x", "PAYGATE_KAFKA_PASSWORD_FILE=y", "PAYGATE_BROKER_KAFKA_SASL_USERNAME=z"}); len(unknown) != 0 {
		t.Fatalf("unknown variables %v", unknown)
	}
	// A certificate file gone since Load is an error naming its key.
	k.TLSCertFile = filepath.Join(t.TempDir(), "gone.pem")
	if _, err := k.TLSConfig(); err == nil || !strings.HasPrefix(err.Error(), "broker.kafka.tls_cert_file: cannot read the client certificate: open ") {
		t.Fatalf("a vanished certificate: %v", err)
	}
	k.TLS = false
	if tc, err := k.TLSConfig(); tc != nil || err != nil {
		t.Fatalf("tls off: %+v %v", tc, err)
	}

	t.Setenv("PAYGATE_BROKER_KIND", "kafka")
	t.Setenv("PAYGATE_BROKER_KAFKA_TLS", "true")
	t.Setenv("PAYGATE_BROKER_KAFKA_TLS_CA_FILE", ca.File)
	t.Setenv("PAYGATE_BROKER_KAFKA_SASL_MECHANISM", "PLAIN")
	t.Setenv("PAYGATE_BROKER_KAFKA_SASL_USERNAME", "svc")
	t.Setenv("PAYGATE_BROKER_KAFKA_SASL_PASSWORD_ENV", "KAFKA_PW")
	c, err = config.Load(writeFile(t, oneProvider))
	if err != nil {
		t.Fatal(err)
	}
	got := c.Broker.Kafka
	if !got.TLS || got.TLSCAFile != ca.File || got.SASL != (config.KafkaSASL{Mechanism: "PLAIN", Username: "svc", PasswordEnv: "KAFKA_PW"}) {
		t.Fatalf("from the environment: %+v", got)
	}
}
