package kafka_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/consumers/conformance"
	"github.com/paygate/paygate/consumers/kafka"
	"github.com/paygate/paygate/internal/testenv"
	"github.com/paygate/paygate/internal/testtls"
)

// brokers is a kfake cluster per test, or the real brokers in PAYGATE_TEST_KAFKA_BROKERS.
func brokers(t *testing.T) []string {
	t.Helper()
	if bs := testenv.KafkaBrokers(); bs != nil {
		return bs
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

func unique() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return "t" + hex.EncodeToString(b[:])
}

func TestConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T) *conformance.Harness {
		return harness(t, kafka.Cluster{Brokers: brokers(t)})
	})
}

// The whole suite again over TLS with a client certificate and SASL SCRAM-SHA-512, as on a managed
// cluster: the group, its readers, the writer (deferrals, dead letters, retry releases) all connect so.
func TestConformanceSecure(t *testing.T) {
	ca := testtls.NewCA(t)
	conformance.Run(t, func(t *testing.T) *conformance.Harness {
		bs := secureCluster(t, kfake.TLS(ca.RequireClients()), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", saslUser, saslPassword))
		return harness(t, kafka.Cluster{Brokers: bs, TLS: clientTLS(t, ca, true), SASL: mechanism(t, "SCRAM-SHA-512", saslPassword)})
	})
}

// harness is the conformance suite's: an adapter on its own group and topics of cl.
func harness(t *testing.T, cl kafka.Cluster) *conformance.Harness {
	o := kafka.Options{Brokers: cl.Brokers, TLS: cl.TLS, SASL: cl.SASL, Group: unique(), TopicPrefix: unique(), Partitions: 2,
		Providers: []string{"acme"}, DelayTiers: []time.Duration{300 * time.Millisecond, 2 * time.Second}}
	open := func() *kafka.Broker {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		b, err := kafka.Open(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	b := open()
	t.Cleanup(func() { b.Abandon(); b.Close() })
	return &conformance.Harness{
		Broker:      b,
		Publish:     b.Publish,
		MinDeferral: 300 * time.Millisecond,
		Crash: func(t *testing.T) consumers.Broker {
			b.Abandon()
			b.Close()
			b2 := open()
			t.Cleanup(func() { b2.Abandon(); b2.Close() })
			return b2
		},
		DeadLetters: func(t *testing.T, want int) []conformance.DeadLetter {
			return readDead(t, cl, o.TopicPrefix+".dead", want)
		},
	}
}

// readDead reads the dead-letter topic from the start until it has want records or 10s pass.
func readDead(t *testing.T, cl kafka.Cluster, topic string, want int) []conformance.DeadLetter {
	t.Helper()
	var out []conformance.DeadLetter
	for p := range 2 {
		r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: cl.Brokers, Dialer: cl.Dialer(), Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		for len(out) < want {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				break
			}
			h := map[string]string{}
			for _, x := range m.Headers {
				h[x.Key] = string(x.Value)
			}
			attempt, _ := strconv.Atoi(h[consumers.HeaderAttempt])
			out = append(out, conformance.DeadLetter{Body: m.Value, Provider: h[consumers.HeaderProvider], Reason: consumers.Reason(h[consumers.HeaderReason]), Error: h[consumers.HeaderError], Attempt: attempt})
		}
		cancel()
		r.Close()
	}
	return out
}

// The names are a public contract (docs/brokers.md, "Kafka topics").
func TestTopicsOf(t *testing.T) {
	got := kafka.TopicsOf("payments", []string{"acme"}, []time.Duration{time.Second, time.Hour})
	if fmt.Sprint(got) != fmt.Sprint(kafka.Topics{Providers: []string{"payments.acme"}, Classes: []string{"payments.acme.high", "payments.acme.low"},
		Retries: []string{"payments.retry.1s", "payments.retry.1h"}, Dead: "payments.dead", Results: "payments.results"}) {
		t.Fatalf("%+v", got)
	}
}

// The dashboard's queue depth on Kafka: the group's lag on a provider's topic, the records not yet
// committed, falls to 0 once they are settled.
func TestLag(t *testing.T) {
	bs := brokers(t)
	o := kafka.Options{Brokers: bs, Group: unique(), TopicPrefix: unique(), Partitions: 2,
		Providers: []string{"acme"}, DelayTiers: []time.Duration{300 * time.Millisecond}}
	ctx, member, b := openMember(t, o, 30*time.Second)
	for i := range 5 {
		if err := b.Publish(ctx, "acme", []byte(`{"id":"l`+strconv.Itoa(i)+`"}`)); err != nil {
			t.Fatal(err)
		}
	}
	topic := kafka.TopicsOf(o.TopicPrefix, o.Providers, o.DelayTiers).Providers[0]
	lag := func() int64 {
		got, err := kafka.Lag(ctx, kafka.Cluster{Brokers: bs}, o.Group, []string{topic, o.TopicPrefix + ".nope"})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := got[o.TopicPrefix+".nope"]; ok || len(got) != 1 {
			t.Fatalf("lag %v: want only %s", got, topic)
		}
		return got[topic]
	}
	if n := lag(); n != 5 {
		t.Fatalf("lag before consuming: %d, want 5", n)
	}
	stream, err := b.Consume(member, "acme")
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		select {
		case d := <-stream:
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatal("fewer than 5 records consumed within 30s")
		}
	}
	for lag() != 0 {
		if ctx.Err() != nil {
			t.Fatalf("lag %d after every record was settled", lag())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// openMember opens a broker of o for a test of at most timeout: ctx is the test's, member the group
// member's life, ended (the member abandoned, the broker closed) when the test ends.
func openMember(t *testing.T, o kafka.Options, timeout time.Duration) (ctx, member context.Context, b *kafka.Broker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	b, err := kafka.Open(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	member, leave := context.WithCancel(ctx)
	t.Cleanup(func() { leave(); b.Abandon(); b.Close() })
	return ctx, member, b
}
