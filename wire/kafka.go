package wire

import (
	"errors"
	"fmt"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/consumers/kafka"
)

// KafkaCluster is how every Kafka client of c connects (the worker's consumer group and writer, enqueue,
// the dashboard's lag, the demo's census): broker.kafka.brokers with the TLS and SASL the configuration
// names. A CA or certificate file it cannot read, or a mechanism without its password, is a ConfigError
// naming the key.
func KafkaCluster(c *config.Config, o Options) (kafka.Cluster, error) {
	k := c.Broker.Kafka
	cl := kafka.Cluster{Brokers: k.Brokers}
	tlsc, err := k.TLSConfig()
	if err != nil {
		return cl, ConfigError{err}
	}
	cl.TLS = tlsc
	if s := k.SASL; s.Mechanism != "" {
		password := o.secret(s.PasswordEnv)
		if password == "" {
			return cl, ConfigError{fmt.Errorf("broker.kafka.sasl.password_env: environment variable %s is not set (nor %s%s): the password of user %q",
				s.PasswordEnv, s.PasswordEnv, config.FileSuffix, s.Username)}
		}
		if cl.SASL, err = kafka.SASL(s.Mechanism, s.Username, password); err != nil {
			return cl, ConfigError{fmt.Errorf("broker.kafka.sasl: %w", err)}
		}
	}
	return cl, nil
}

// kafkaRefusal turns a refusal of the brokers (see kafka.ErrAuthentication) into a ConfigError naming the
// setting to fix: no retry mends it, so `worker run` and the tools stop at once with status 2. Other errors
// it returns as they are.
func kafkaRefusal(k config.Kafka, err error) error {
	var setting string
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kafka.ErrAuthentication):
		setting = fmt.Sprintf("broker.kafka.sasl: the brokers refused user %q with %s (password from $%s)", k.SASL.Username, k.SASL.Mechanism, k.SASL.PasswordEnv)
		if k.SASL.Mechanism == "" {
			setting = "broker.kafka.sasl: the brokers refused the connection's authentication"
		}
	case errors.Is(err, kafka.ErrUntrusted):
		setting = "broker.kafka.tls_ca_file: the broker's certificate does not verify against "
		if k.TLSCAFile != "" {
			setting += k.TLSCAFile
		} else {
			setting += "the system's roots (set tls_ca_file to the CA that signed it)"
		}
	case errors.Is(err, kafka.ErrClientCertificate) && k.TLSCertFile == "":
		setting = "broker.kafka.tls_cert_file: the broker wants a client certificate (set tls_cert_file and tls_key_file)"
	case errors.Is(err, kafka.ErrClientCertificate):
		setting = "broker.kafka.tls_cert_file: the broker refused the client certificate " + k.TLSCertFile
	default:
		return err
	}
	return ConfigError{fmt.Errorf("%s: %w", setting, err)}
}
