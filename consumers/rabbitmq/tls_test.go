package rabbitmq_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/consumers/rabbitmq"
	"github.com/paygate/paygate/internal/testenv"
	"github.com/paygate/paygate/internal/testtls"
)

// tlsBroker puts a TLS proxy, with a certificate of a CA made for the test, in front of the test broker
// and returns an amqps:// URL through it, the proxy and the CA.
func tlsBroker(t *testing.T) (string, *testtls.Proxy, *testtls.CA) {
	t.Helper()
	ca := testtls.NewCA(t)
	amqps, proxy := tlsBrokerWith(t, ca.Server)
	return amqps, proxy, ca
}

// tlsBrokerWith puts a TLS proxy that handshakes with server in front of the test broker and returns an
// amqps:// URL through it, and the proxy.
func tlsBrokerWith(t *testing.T, server *tls.Config) (string, *testtls.Proxy) {
	t.Helper()
	u, err := url.Parse(testenv.AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	proxy := testtls.ProxyWith(t, u.Host, server)
	u.Scheme, u.Host = "amqps", proxy.Addr
	return u.String(), proxy
}

// The adapter publishes and consumes through amqps:// with a private CA, on both connections, and after
// the connections drop it reconnects through TLS again.
func TestAMQPS(t *testing.T) {
	amqps, proxy, ca := tlsBroker(t)
	tlsc, err := config.RabbitMQ{TLSCAFile: ca.File}.TLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	x := "test-tls-" + hex.EncodeToString(b[:])
	tiers := []time.Duration{200 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	br, err := rabbitmq.Open(ctx, rabbitmq.Options{URL: amqps, TLS: tlsc, Exchange: x, Prefetch: 4, Providers: []string{"acme"}, DelayTiers: tiers})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		br.Close()
		deleteTopology(x, tiers)
	})
	if n := proxy.Forwarded(); n != 2 {
		t.Fatalf("%d connections through the TLS proxy, want 2 (consume and publish)", n)
	}
	stream, err := br.Consume(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	roundTrip := func(body string) {
		t.Helper()
		if err := br.Publish(ctx, "acme", []byte(body)); err != nil {
			t.Fatal(err)
		}
		d := next(t, stream, 10*time.Second)
		if string(d.Body()) != body {
			t.Fatalf("got %q, want %q", d.Body(), body)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	roundTrip(`{"id":"tls-1"}`)

	proxy.Drop() // both connections die; the supervisors redial, through TLS again
	deadline := time.Now().Add(30 * time.Second)
	for proxy.Forwarded() < 4 || br.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("not reconnected: %d connections through the proxy, ready: %v", proxy.Forwarded(), br.Ready())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The publisher's channel died with its connection; a publish may fail once before it reopens.
	for i := 0; ; i++ {
		err := br.Publish(ctx, "acme", []byte(`{"id":"tls-2"}`))
		if err == nil {
			break
		}
		if i == 20 {
			t.Fatalf("publish after reconnecting: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for {
		// tls-1 may come again: its ack can have been lost with the connection (at least once).
		d := next(t, stream, 15*time.Second)
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		if body := string(d.Body()); body == `{"id":"tls-2"}` {
			break
		} else if body != `{"id":"tls-1"}` {
			t.Fatalf("after reconnecting got %q", body)
		}
	}
	if proxy.Refused() != 0 {
		t.Fatalf("%d handshakes refused", proxy.Refused())
	}
}

// Without the private CA the handshake fails with an unknown authority, and nothing reaches the broker.
// A TLS configuration with a URL it would not apply to is refused before dialling.
func TestAMQPSRefusals(t *testing.T) {
	amqps, proxy, ca := tlsBroker(t)
	tlsc, err := config.RabbitMQ{TLSCAFile: ca.File}.TLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	tiers := []time.Duration{time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = rabbitmq.Open(ctx, rabbitmq.Options{URL: amqps, Exchange: "test-tls-unused", Providers: []string{"acme"}, DelayTiers: tiers})
	if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("without the CA: %v", err)
	}
	if proxy.Forwarded() != 0 {
		t.Fatalf("%d connections reached the broker without a verified handshake", proxy.Forwarded())
	}
	plain := strings.Replace(amqps, "amqps://", "amqp://", 1)
	for _, tt := range []struct{ url, want string }{
		{plain, "rabbitmq: a TLS configuration needs an amqps:// URL, got amqp://"},
		{amqps + "?cacertfile=/etc/ca.pem", "rabbitmq: the URL's TLS parameter cacertfile would be ignored with a TLS configuration given"},
	} {
		_, err := rabbitmq.Open(ctx, rabbitmq.Options{URL: tt.url, TLS: tlsc, Exchange: "test-tls-unused", Providers: []string{"acme"}, DelayTiers: tiers})
		if err == nil || err.Error() != tt.want || strings.Contains(err.Error(), "guest@") {
			t.Errorf("%s: %v, want %s", tt.url, err, tt.want)
		}
	}
}

// RabbitMQ's own listener here has no TLS: a TLS-terminating proxy that requires client certificates the
// test's CA signed (as RabbitMQ's ssl_options.verify = verify_peer with fail_if_no_peer_cert = true does)
// stands in front of it. With broker.rabbitmq.tls_cert_file and tls_key_file both connections present the
// certificate and the adapter works; without them, or with one the CA did not sign, the handshake is
// refused and nothing reaches the broker.
func TestAMQPSMutualTLS(t *testing.T) {
	ca := testtls.NewCA(t)
	amqps, proxy := tlsBrokerWith(t, ca.RequireClients())
	cert, key := ca.Client(t, "paygate-worker")
	stranger := testtls.NewCA(t)
	strangerCert, strangerKey := stranger.Client(t, "paygate-worker")
	var b [6]byte
	_, _ = rand.Read(b[:])
	x := "test-mtls-" + hex.EncodeToString(b[:])
	tiers := []time.Duration{time.Second}
	open := func(r config.RabbitMQ, within time.Duration) (*rabbitmq.Broker, error) {
		t.Helper()
		tlsc, err := r.TLSConfig()
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		return rabbitmq.Open(ctx, rabbitmq.Options{URL: amqps, TLS: tlsc, Exchange: x, Prefetch: 4, Providers: []string{"acme"}, DelayTiers: tiers})
	}

	for _, tt := range []struct {
		name string
		r    config.RabbitMQ
	}{
		{"without a client certificate", config.RabbitMQ{TLSCAFile: ca.File}},
		{"with one another CA signed", config.RabbitMQ{TLSCAFile: ca.File, TLSCertFile: strangerCert, TLSKeyFile: strangerKey}},
	} {
		refused := proxy.Refused()
		br, err := open(tt.r, 2*time.Second) // Open retries until then
		if err == nil {
			br.Close()
			t.Fatalf("%s: opened", tt.name)
		}
		// The error is the last attempt's: under TLS 1.3 the proxy's alert (certificate required, unknown
		// certificate authority) comes after the client's handshake, and amqp091-go, writing at once, may
		// see only the connection closed. The proxy counts the refusals.
		if proxy.Refused() == refused || proxy.Forwarded() != 0 {
			t.Fatalf("%s: %d more refused, %d forwarded to the broker", tt.name, proxy.Refused()-refused, proxy.Forwarded())
		}
		t.Logf("%s: %v", tt.name, err)
	}

	br, err := open(config.RabbitMQ{TLSCAFile: ca.File, TLSCertFile: cert, TLSKeyFile: key}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		br.Close()
		deleteTopology(x, tiers)
	})
	if n := proxy.Forwarded(); n != 2 {
		t.Fatalf("%d connections through the proxy, want 2 (consume and publish)", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := br.Consume(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if err := br.Publish(ctx, "acme", []byte(`{"id":"mtls-1"}`)); err != nil {
		t.Fatal(err)
	}
	d := next(t, stream, 10*time.Second)
	if string(d.Body()) != `{"id":"mtls-1"}` {
		t.Fatalf("got %q", d.Body())
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}
