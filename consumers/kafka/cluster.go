package kafka

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// Cluster is how every client of the adapter reaches Kafka: the bootstrap brokers, and the TLS and SASL of
// each connection. The consumer group, its readers, the writer, the topic creation at Open, Lag and
// DeleteTopics all connect with it.
type Cluster struct {
	Brokers []string
	TLS     *tls.Config    // nil: plaintext; the server name comes from the address dialled
	SASL    sasl.Mechanism // nil: no authentication (kafka-go's sasl/plain and sasl/scram make one)
}

// Dialer dials as kafka-go's default dialer does, with the cluster's TLS and SASL: for the consumer group,
// its readers and direct connections.
func (c Cluster) Dialer() *kafkago.Dialer {
	return &kafkago.Dialer{Timeout: 10 * time.Second, DualStack: true, TLS: c.TLS, SASLMechanism: c.SASL}
}

// Transport is a transport of its own, for a Writer or a kafkago.Client, with the cluster's TLS and SASL;
// the caller closes its idle connections when done (a Writer does not close a transport it was given).
func (c Cluster) Transport() *kafkago.Transport {
	return &kafkago.Transport{Dial: (&net.Dialer{Timeout: 3 * time.Second}).DialContext, TLS: c.TLS, SASL: c.SASL}
}

// SASL returns kafka-go's mechanism of that name: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512. Its error never
// holds the password.
func SASL(mechanism, username, password string) (sasl.Mechanism, error) {
	var algo scram.Algorithm
	switch mechanism {
	case "PLAIN":
		return plain.Mechanism{Username: username, Password: password}, nil
	case "SCRAM-SHA-256":
		algo = scram.SHA256
	case "SCRAM-SHA-512":
		algo = scram.SHA512
	default:
		return nil, fmt.Errorf("kafka: unknown SASL mechanism %q (want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)", mechanism)
	}
	m, err := scram.Mechanism(algo, username, password)
	if err != nil { // SASLprep refused the user or the password
		return nil, fmt.Errorf("kafka: %s: the user name or the password is not valid SASLprep text", mechanism)
	}
	return m, nil
}

// The refusals no retry mends: a connection's error wraps one of these (errors.Is) when the brokers, or the
// client, refused the credentials or a certificate.
var (
	// ErrAuthentication: the brokers refused the SASL credentials, or the mechanism.
	ErrAuthentication = errors.New("kafka: SASL authentication refused")
	// ErrUntrusted: the broker's certificate does not verify (signed by a CA the client does not trust,
	// for another name, expired).
	ErrUntrusted = errors.New("kafka: the broker's certificate is not trusted")
	// ErrClientCertificate: the broker refused the client's certificate, or asked for one it was not given.
	ErrClientCertificate = errors.New("kafka: the broker refused the client certificate")
)

// wrap is "kafka: what: err", led instead by the refusal err shows, if any ("kafka: SASL authentication
// refused: what: err"), so that errors.Is finds it.
func wrap(what string, err error) error {
	if kind := refusalOf(err); kind != nil {
		return fmt.Errorf("%w: %s: %w", kind, what, err)
	}
	return fmt.Errorf("kafka: %s: %w", what, err)
}

func refusalOf(err error) error {
	var (
		verify *tls.CertificateVerificationError
		op     *net.OpError
	)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kafkago.SASLAuthenticationFailed), errors.Is(err, kafkago.UnsupportedSASLMechanism),
		errors.Is(err, kafkago.IllegalSASLState):
		return ErrAuthentication
	case errors.As(err, &verify):
		return ErrUntrusted
	case errors.As(err, &op) && op.Op == "remote error" && strings.Contains(op.Err.Error(), "certificate"):
		// A TLS alert from the broker (crypto/tls gives no exported type for it): bad certificate, unknown
		// certificate authority, certificate required.
		return ErrClientCertificate
	}
	return nil
}

// Refused reports whether err is one of the refusals above.
func Refused(err error) bool { return refusalOf(err) != nil }

// explain is wrap for an error of a Transport's request. kafka-go's Transport reports a refused SASL
// exchange as an unexpected EOF (the broker closes the connection without an answer it reads), so when
// err shows no refusal and SASL is on, one connection through the Dialer, which reads the broker's
// answer, says whether it was one.
func (c Cluster) explain(ctx context.Context, what string, err error) error {
	if Refused(err) || c.SASL == nil {
		return wrap(what, err)
	}
	for _, addr := range c.Brokers {
		conn, derr := c.Dialer().DialContext(ctx, "tcp", addr)
		if derr == nil {
			_ = conn.Close()
			break
		}
		if Refused(derr) {
			return wrap(what, fmt.Errorf("%w; on a connection of its own: %w", err, derr))
		}
	}
	return wrap(what, err)
}
