package wire

import (
	"context"
	"slices"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/consumers/kafka"
	"github.com/paygate/paygate/consumers/rabbitmq"
	"github.com/paygate/paygate/dashboard"
	"github.com/paygate/paygate/job"
)

// Backlog returns a reader of the jobs waiting for each provider in the broker the configuration names,
// by route (the provider's name, <provider>.high, <provider>.low: dashboard.Backlog), for the operator's
// view (worker dashboard): on RabbitMQ the ready messages of the providers' queues, by passive declares on
// a connection of its own, which the returned func closes; on Kafka the consumer group's lag on the
// providers' topics. On RabbitMQ without a URL (the variable
// broker.rabbitmq.url_env names is not set) it returns nil and a no-op close: there is no backlog to read.
func Backlog(c *config.Config, o Options) (dashboard.Backlog, func(), error) {
	names := c.ProviderNames()
	bn := BrokerNames(c)
	route := map[string]string{} // queue or topic -> its route: provider, provider.high, provider.low
	for i, k := range bn.Providers {
		route[k] = names[i]
		route[bn.Classes[2*i]] = consumers.Route(names[i], job.High)
		route[bn.Classes[2*i+1]] = consumers.Route(names[i], job.Low)
	}
	keys := append(slices.Clone(bn.Providers), bn.Classes...)
	byName := func(got map[string]int64) map[string]int64 { // by route, as dashboard.Backlog reads them
		out := make(map[string]int64, len(keys))
		for _, k := range keys {
			if n, ok := got[k]; ok {
				out[route[k]] = n
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
