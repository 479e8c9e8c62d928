package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/consumers/kafka"
	"github.com/paygate/paygate/consumers/rabbitmq"
	"github.com/paygate/paygate/gate"
)

// checkConfig is "worker check-config": validate a configuration file and print what it configures, then
// warn about each secret its environment does not give (warnUnsetSecrets).
func checkConfig(args []string, stdout, stderr io.Writer) error {
	c, path, err := loadRunnable("check-config", args, stderr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: valid\n", path)
	printServices(stdout, c)
	if err := printProviders(stdout, c); err != nil {
		return err
	}
	printCapacity(stdout, c)
	warnUnsetSecrets(stderr, c)
	return nil
}

// printServices prints the lines for Redis, the broker and the gate.
func printServices(stdout io.Writer, c *config.Config) {
	fmt.Fprintf(stdout, "redis:  %s, key prefix %q\n", c.Redis, c.Redis.KeyPrefix)
	switch c.Broker.Kind {
	case "rabbitmq":
		fmt.Fprintf(stdout, "broker: rabbitmq, exchange %q, url from $%s\n", c.Broker.RabbitMQ.Exchange, c.Broker.RabbitMQ.URLEnv)
	case "kafka":
		fmt.Fprintf(stdout, "broker: kafka %s, group %q, topic prefix %q, %s\n", strings.Join(c.Broker.Kafka.Brokers, ","), c.Broker.Kafka.Group,
			c.Broker.Kafka.TopicPrefix, c.Broker.Kafka.Security())
	}
	printResults(stdout, c)
	if c.Gate.MarginMax > c.Gate.Margin {
		fmt.Fprintf(stdout, "gate:   margin %s, following the fleet's lateness up to %s\n", c.Gate.Margin, c.Gate.MarginMax)
	} else {
		fmt.Fprintf(stdout, "gate:   margin %s\n", c.Gate.Margin)
	}
}

// printProviders prints the table of providers, one row each.
func printProviders(stdout io.Writer, c *config.Config) error {
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROVIDER\tLIMITS\tALGORITHM\tPACE\tTIMEOUT\tURL")
	for _, name := range c.ProviderNames() {
		p := c.Providers[name]
		limits, algo := providerLimits(p)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", name, strings.Join(limits, ","), algo, providerPace(p, c.Gate.Margin), p.Timeout, p.URL)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	printAccess(stdout, c)
	printBreakers(stdout, c)
	return nil
}

// printAccess prints each provider's auth (its type, where its secrets come from, never a value) and
// client certificate, and its endpoints when it has any.
func printAccess(stdout io.Writer, c *config.Config) {
	for _, name := range c.ProviderNames() {
		p := c.Providers[name]
		fmt.Fprintf(stdout, "%s: auth %s%s\n", name, p.Authentication(), p.DescribeTLS())
		if len(p.Endpoints) == 0 {
			continue
		}
		var eps []string
		for _, op := range slices.Sorted(maps.Keys(p.Endpoints)) {
			ep := p.Endpoints[op]
			eps = append(eps, fmt.Sprintf("%s %s %s cost %d", op, ep.Method, ep.Path, max(ep.Cost, 1)))
		}
		fmt.Fprintf(stdout, "%s: endpoints (one budget) %s\n", name, strings.Join(eps, "; "))
	}
}

// providerLimits is a provider's LIMITS and ALGORITHM columns.
func providerLimits(p config.Provider) (limits []string, algo string) {
	for _, pol := range p.Policies() {
		limits = append(limits, pol.String())
	}
	algo = p.Algorithm
	if p.Buckets != 0 {
		algo = fmt.Sprintf("%s (%d buckets)", algo, p.Buckets)
	}
	if p.Mode == config.ModeShadow {
		algo += ", shadow mode (nothing held back)"
	}
	if p.Adaptive != nil {
		limits = []string{fmt.Sprintf("learned %s..%s", p.Adaptive.Min, p.Adaptive.Max)}
	}
	if p.MaxInFlight > 0 {
		limits = append(limits, fmt.Sprintf("%d in flight", p.MaxInFlight))
	}
	if p.HasMerchants() {
		algo += ", fair shares between merchants"
		per, named := p.MerchantPolicies()
		if len(per) > 0 {
			limits = append(limits, "per merchant "+gate.FormatPolicies(per))
		}
		if len(named) > 0 {
			limits = append(limits, fmt.Sprintf("%d named merchants", len(named)))
		}
	}
	return limits, algo
}

// providerPace is a provider's PACE column: how far apart the gate spaces its requests.
func providerPace(p config.Provider, margin time.Duration) string {
	pace := "none (quotas only)"
	if every := gate.PaceOf(p.Policies(), margin); every > 0 && p.Burst >= gate.ShortestPolicy(p.Policies()).Limit {
		pace = "none (burst = the limit)"
	} else if every > 0 {
		pace = "every " + every.String()
		if p.Burst > 1 {
			pace += fmt.Sprintf(", burst %d", p.Burst)
		}
	}
	return pace
}

// printCapacity prints what the fleet can do and the warnings about it.
func printCapacity(stdout io.Writer, c *config.Config) {
	lines, warn := capacity(c)
	fmt.Fprintln(stdout, "capacity:")
	for _, l := range lines {
		fmt.Fprintln(stdout, "  "+l)
	}
	for _, w := range warn {
		fmt.Fprintln(stdout, "warning: "+w)
	}
}

// printResults says where results go, or that they are off.
func printResults(stdout io.Writer, c *config.Config) {
	if !c.Results.Enabled {
		fmt.Fprintln(stdout, "results: off (results.enabled)")
		return
	}
	where := rabbitmq.Results(c.Broker.RabbitMQ.Exchange) + " (exchange and queue)"
	if c.Broker.Kind == "kafka" {
		where = kafka.ResultsTopic(c.Broker.Kafka.TopicPrefix) + " (topic)"
	}
	fmt.Fprintln(stdout, "results: "+where)
}
