package wire

import (
	"context"
	"slices"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/consumers/kafka"
	"github.com/paygate/paygate/consumers/rabbitmq"
	"github.com/paygate/paygate/dashboard"
)

// Backlog returns a reader of the jobs waiting for each provider in the broker the configuration names,
// by provider name, for the operator's view (worker dashboard): on RabbitMQ the ready messages of the
// providers. queues (every class together), by passive declares on a connection of its own, which the returned func closes; on
// Kafka the consumer group's lag on the providers' topics. On RabbitMQ without a URL (the variable
// broker.rabbitmq.url_env names is not set) it returns nil and a no-op close: there is no backlog to read.
func Backlog(c *config.Config, o Options) (dashboard.Backlog, func(), error) {
	names := c.ProviderNames()
	bn := BrokerNames(c)
	owner := map[string]string{} // queue or topic -> provider: one per provider and class
	for i, k := range bn.Providers {
		owner[k], owner[bn.Classes[2*i]], owner[bn.Classes[2*i+1]] = names[i], names[i], names[i]
	}
	keys := append(slices.Clone(bn.Providers), bn.Classes...)
	byName := func(got map[string]int64) map[string]int64 { // every class of a provider together
		out := make(map[string]int64, len(names))
		for _, k := range keys {
			if n, ok := got[k]; ok {
				out[owner[k]] += n
			}
		}
		return out
	}
	switch c.Broker.Kind {
	case "kafka":
		k := c.Broker.Kafka
		cl, err := KafkaCluster(c, o)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context) (map[string]int64, error) {
			lag, err := kafka.Lag(ctx, cl, k.Group, keys)
			return byName(lag), kafkaRefusal(k, err)
		}, func() {}, nil
	default:
		r := c.Broker.RabbitMQ
		url := o.secret(r.URLEnv)
		if url == "" {
			return nil, func() {}, nil
		}
		tlsc, err := r.TLSConfig()
		if err == nil {
			err = r.CheckTLSURL(url)
		}
		if err != nil {
			return nil, nil, ConfigError{err}
		}
		in := rabbitmq.NewInspector(url, tlsc)
		return func(context.Context) (map[string]int64, error) {
			depths, err := in.Depths(keys)
			return byName(depths), rabbitRefusal(r, err)
		}, func() { _ = in.Close() }, nil
	}
}
