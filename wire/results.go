package wire

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/consumers/kafka"
	"github.com/paygate/paygate/consumers/rabbitmq"
)

// FollowResults hands out every result of the broker c names as it arrives (provider "" for every
// provider's), until ctx ends: on RabbitMQ through a queue of its own bound to X.results (results from
// now on; the X.results queue the platform consumes is left alone), on Kafka from the oldest record T.results
// retains, without a consumer group. Neither takes a result from anyone. bound is called, with what is
// followed, once results can arrive.
func FollowResults(ctx context.Context, c *config.Config, o Options, provider string, bound func(what string), out func([]byte)) error {
	switch c.Broker.Kind {
	case "kafka":
		cl, err := KafkaCluster(c, o)
		if err != nil {
			return err
		}
		topic := kafka.ResultsTopic(c.Broker.Kafka.TopicPrefix)
		err = kafka.Follow(ctx, cl, c.Broker.Kafka.TopicPrefix, func() { bound("topic " + topic + " from its oldest record") }, func(body []byte) {
			if provider == "" || providerOf(body) == provider {
				out(body)
			}
		})
		return kafkaRefusal(c.Broker.Kafka, err)
	default:
		r := c.Broker.RabbitMQ
		url := o.secret(r.URLEnv)
		if url == "" {
			return ConfigError{fmt.Errorf("broker.rabbitmq.url_env: environment variable %s is not set", r.URLEnv)}
		}
		tlsc, err := r.TLSConfig()
		if err == nil {
			err = r.CheckTLSURL(url)
		}
		if err != nil {
			return ConfigError{err}
		}
		pattern := "#"
		if provider != "" {
			pattern = provider + ".*"
		}
		x := rabbitmq.Results(r.Exchange)
		return rabbitRefusal(r, rabbitmq.Follow(ctx, url, rabbitmq.Options{Exchange: r.Exchange, TLS: tlsc}, pattern,
			func() { bound("exchange " + x + " (" + pattern + ") from now on") }, out))
	}
}

func providerOf(body []byte) string {
	var r struct {
		Provider string `json:"provider"`
	}
	_ = json.Unmarshal(body, &r)
	return r.Provider
}
