package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/consumers/kafka"
	"github.com/paygate/paygate/consumers/rabbitmq"
	"github.com/paygate/paygate/dashboard"
	"github.com/paygate/paygate/wire"
)

// dashboardCmd is "worker dashboard": one live page of every configured provider's budget, read from Redis
// by this process once a second, until SIGTERM.
func dashboardCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, path := newFlags("dashboard", stderr)
	listen := fs.String("listen", "127.0.0.1:8080", "address to serve the page on (loopback by default)")
	if err := parse(fs, args); err != nil {
		return err
	}
	c, err := loadConfig(*path, stderr)
	if err != nil {
		return err
	}
	rdb, err := wire.Redis(c)
	if err != nil {
		return err
	}
	defer rdb.Close()
	l, err := wire.Gate(c, rdb, wire.Tool)
	if err != nil {
		return err
	}
	names := c.ProviderNames()
	src := dashboard.GateSource(l, names)
	backlog, closeBacklog, err := brokerBacklog(c, names)
	if err != nil {
		return err
	}
	defer closeBacklog()
	if backlog != nil {
		src = dashboard.WithBacklog(src, backlog)
	} else {
		fmt.Fprintf(stderr, "dashboard: $%s is not set: queue depths are not shown\n", c.Broker.RabbitMQ.URLEnv)
	}
	srv := dashboard.New(src, time.Second, 300)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return usageError{fmt.Errorf("dashboard: --listen %s: %w", *listen, err)}
	}
	fmt.Fprintf(stdout, "dashboard of %d providers listening on %s (http://%s/)\n", len(names), ln.Addr(), ln.Addr())
	go srv.Run(ctx)
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// brokerBacklog reads the jobs waiting for each provider: on RabbitMQ by passive declares of the
// providers' queues (on a connection of its own), on Kafka from the consumer group's committed offsets.
// nil (and nothing to close) when RabbitMQ's URL is not set.
func brokerBacklog(c *config.Config, names []string) (dashboard.Backlog, func(), error) {
	byName := func(keys []string, got map[string]int64) map[string]int64 {
		out := make(map[string]int64, len(got))
		for i, k := range keys {
			if n, ok := got[k]; ok {
				out[names[i]] = n
			}
		}
		return out
	}
	switch c.Broker.Kind {
	case "kafka":
		k := c.Broker.Kafka
		cl, err := wire.KafkaCluster(c, wire.Options{})
		if err != nil {
			return nil, nil, err
		}
		topics := kafka.TopicsOf(k.TopicPrefix, names, c.Worker.DelayTiers).Providers
		return func(ctx context.Context) (map[string]int64, error) {
			lag, err := kafka.Lag(ctx, cl, k.Group, topics)
			return byName(topics, lag), err
		}, func() {}, nil
	default:
		r := c.Broker.RabbitMQ
		url := config.Secret(r.URLEnv)
		if url == "" {
			return nil, func() {}, nil
		}
		tlsc, err := r.TLSConfig()
		if err != nil {
			return nil, nil, err
		}
		in := rabbitmq.NewInspector(url, tlsc)
		queues := rabbitmq.TopologyOf(r.Exchange, names, c.Worker.DelayTiers).Queues
		return func(context.Context) (map[string]int64, error) {
			depths, err := in.Depths(queues)
			return byName(queues, depths), err
		}, func() { _ = in.Close() }, nil
	}
}
