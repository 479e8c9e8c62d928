package kafka_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go/sasl"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/paygate/paygate/consumers/kafka"
	"github.com/paygate/paygate/internal/testtls"
)

const (
	saslUser     = "paygate"
	saslPassword = "s3cret-Kafka-pw"
)

// secureCluster starts a kfake cluster with opts (TLS, SASL) and closes it when the test ends.
func secureCluster(t *testing.T, opts ...kfake.Opt) []string {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// clientTLS trusts only ca and presents the client certificate it signs when client is true, as
// config.Kafka.TLSConfig builds it.
func clientTLS(t *testing.T, ca *testtls.CA, client bool) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(ca.File)
	if err != nil {
		t.Fatal(err)
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: x509.NewCertPool()}
	c.RootCAs.AppendCertsFromPEM(pem)
	if client {
		certFile, keyFile := ca.Client(t, "paygate")
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c
}

func mechanism(t *testing.T, name, password string) sasl.Mechanism {
	t.Helper()
	m, err := kafka.SASL(name, saslUser, password)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Over TLS (a private CA, then client certificates required) and with each SASL mechanism, every client
// of the adapter connects: Open creates the topics, Publish produces with the writer, the group member
// consumes, the ack is committed (the group's lag, read by Lag, falls to 0), and DeleteTopics removes them.
func TestSecureClusters(t *testing.T) {
	ca := testtls.NewCA(t)
	tests := []struct {
		name   string
		server []kfake.Opt
		tls    bool // the client's TLS: trusting ca
		client bool // and presenting a certificate ca signed
		mech   string
	}{
		{"tls", []kfake.Opt{kfake.TLS(ca.Server)}, true, false, ""},
		{"tls, client certificate required", []kfake.Opt{kfake.TLS(ca.RequireClients())}, true, true, ""},
		{"sasl PLAIN", []kfake.Opt{kfake.EnableSASL(), kfake.Superuser("PLAIN", saslUser, saslPassword)}, false, false, "PLAIN"},
		{"sasl SCRAM-SHA-256 over tls", []kfake.Opt{kfake.TLS(ca.Server), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", saslUser, saslPassword)},
			true, false, "SCRAM-SHA-256"},
		{"sasl SCRAM-SHA-512 over tls with a client certificate", []kfake.Opt{kfake.TLS(ca.RequireClients()), kfake.EnableSASL(),
			kfake.Superuser("SCRAM-SHA-512", saslUser, saslPassword)}, true, true, "SCRAM-SHA-512"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := kafka.Options{Brokers: secureCluster(t, tt.server...), Group: unique(), TopicPrefix: unique(), Partitions: 2,
				Providers: []string{"acme"}, DelayTiers: []time.Duration{300 * time.Millisecond}}
			if tt.tls {
				o.TLS = clientTLS(t, ca, tt.client)
			}
			if tt.mech != "" {
				o.SASL = mechanism(t, tt.mech, saslPassword)
			}
			cluster := kafka.Cluster{Brokers: o.Brokers, TLS: o.TLS, SASL: o.SASL}
			consumeOne(t, o, cluster)
		})
	}
}

// consumeOne publishes a job, consumes and acks it through the group, waits for the commit (the lag at
// 0), and deletes the topics.
func consumeOne(t *testing.T, o kafka.Options, cluster kafka.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := kafka.Open(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	member, leave := context.WithCancel(ctx)
	defer func() { leave(); b.Close() }()
	if err := b.Publish(ctx, "acme", []byte(`{"id":"secure-1"}`)); err != nil {
		t.Fatal(err)
	}
	topics := kafka.TopicsOf(o.TopicPrefix, o.Providers, o.DelayTiers)
	if lag, err := kafka.Lag(ctx, cluster, o.Group, topics.Providers); err != nil || lag[topics.Providers[0]] != 1 {
		t.Fatalf("lag before consuming: %v %v, want 1", lag, err)
	}
	stream, err := b.Consume(member, "acme")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-stream:
		if string(d.Body()) != `{"id":"secure-1"}` {
			t.Fatalf("consumed %q", d.Body())
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("nothing consumed within 30s")
	}
	for {
		lag, err := kafka.Lag(ctx, cluster, o.Group, topics.Providers)
		if err != nil {
			t.Fatal(err)
		}
		if lag[topics.Providers[0]] == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("lag %v after the ack: never committed", lag)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := b.Ready(); err != nil {
		t.Fatalf("ready: %v", err)
	}
	leave()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := kafka.DeleteTopics(ctx, cluster, topics); err != nil {
		t.Fatal(err)
	}
}

// What no retry mends fails Open at once, well within 5 s, as the refusal it is (the worker names the
// setting from it), and never shows the password: a wrong password, a mechanism the brokers do not take,
// a certificate from a CA the client does not trust, no client certificate where one is required or one
// from another CA. Lag refuses alike.
func TestRefusals(t *testing.T) {
	ca, other := testtls.NewCA(t), testtls.NewCA(t)
	scram := []kfake.Opt{kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", saslUser, saslPassword)}
	tests := []struct {
		name   string
		server []kfake.Opt
		tls    *tls.Config
		mech   sasl.Mechanism
		want   error
	}{
		{"a wrong password", scram, nil, mechanism(t, "SCRAM-SHA-512", "hunter2"), kafka.ErrAuthentication},
		{"a wrong PLAIN password over tls", append([]kfake.Opt{kfake.TLS(ca.Server), kfake.Superuser("PLAIN", saslUser, saslPassword)}, scram...),
			clientTLS(t, ca, false), mechanism(t, "PLAIN", "hunter2"), kafka.ErrAuthentication},
		{"a mechanism the brokers lack", scram, nil, mechanism(t, "SCRAM-SHA-256", saslPassword), kafka.ErrAuthentication},
		{"an untrusted certificate", []kfake.Opt{kfake.TLS(ca.Server)}, clientTLS(t, other, false), nil, kafka.ErrUntrusted},
		{"no client certificate", []kfake.Opt{kfake.TLS(ca.RequireClients())}, clientTLS(t, ca, false), nil, kafka.ErrClientCertificate},
		{"a client certificate of another CA", []kfake.Opt{kfake.TLS(ca.RequireClients())},
			func() *tls.Config {
				c := clientTLS(t, other, true)
				c.RootCAs = clientTLS(t, ca, false).RootCAs
				return c
			}(), nil, kafka.ErrClientCertificate},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := kafka.Options{Brokers: secureCluster(t, tt.server...), Group: unique(), TopicPrefix: unique(), Partitions: 1,
				Providers: []string{"acme"}, DelayTiers: []time.Duration{time.Second}, TLS: tt.tls, SASL: tt.mech}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			b, err := kafka.Open(ctx, o)
			took := time.Since(start)
			if err == nil {
				b.Close()
				t.Fatal("opened")
			}
			if !errors.Is(err, tt.want) || !kafka.Refused(err) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
			if took > 5*time.Second {
				t.Fatalf("refused after %s, want within 5s", took)
			}
			if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), saslPassword) {
				t.Fatalf("the error shows a password: %v", err)
			}
			t.Logf("refused in %s: %v", took.Round(time.Millisecond), err)
			_, err = kafka.Lag(ctx, kafka.Cluster{Brokers: o.Brokers, TLS: o.TLS, SASL: o.SASL}, o.Group, []string{o.TopicPrefix + ".acme"})
			if !errors.Is(err, tt.want) {
				t.Fatalf("lag: got %v, want %v", err, tt.want)
			}
		})
	}
}
