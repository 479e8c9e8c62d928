package main

import (
	"fmt"
	"io"

	"github.com/paygate/paygate/config"
)

// secretVar is one environment variable the configuration reads a secret from: the *_env key naming it,
// the variable, and what `worker run` does when neither the variable nor its _FILE companion gives a value.
type secretVar struct {
	key, name, unset string
}

// secretVars lists the variables c reads secrets from, as `worker run` reads them: the AMQP URL only on
// RabbitMQ, the SASL password only with a mechanism, a provider's auth_env only with its auth_header.
func secretVars(c *config.Config) []secretVar {
	var vs []secretVar
	if c.Redis.PasswordEnv != "" {
		vs = append(vs, secretVar{"redis.password_env", c.Redis.PasswordEnv,
			"worker run connects to Redis without a password (a Redis that wants one refuses it, NOAUTH, and run stops at start with exit status 2)"})
	}
	switch b := c.Broker; {
	case b.Kind == "rabbitmq":
		vs = append(vs, secretVar{"broker.rabbitmq.url_env", b.RabbitMQ.URLEnv,
			"worker run and enqueue stop at start with exit status 2 (the AMQP URL has no default)"})
	case b.Kind == "kafka" && b.Kafka.SASL.Mechanism != "":
		vs = append(vs, secretVar{"broker.kafka.sasl.password_env", b.Kafka.SASL.PasswordEnv,
			fmt.Sprintf("worker run and enqueue stop at start with exit status 2 (the %s password of user %q)", b.Kafka.SASL.Mechanism, b.Kafka.SASL.Username)})
	}
	for _, name := range c.ProviderNames() {
		p := c.Providers[name]
		for _, s := range p.AuthSecrets() {
			vs = append(vs, secretVar{"providers." + name + "." + s.Key, s.Env,
				"worker run stops at start with exit status 2 (" + authUse(name, p.Authentication()) + ")"})
		}
	}
	return vs
}

// authUse says what a provider's requests do with the secrets of its auth a.
func authUse(name string, a *config.Auth) string {
	switch a.Type {
	case config.AuthTypeOAuth2:
		return fmt.Sprintf("%s's token requests carry it to %s", name, a.TokenURL)
	case config.AuthTypeHMAC:
		return fmt.Sprintf("%s's requests are signed with it in %s", name, a.SignatureHeader)
	}
	return fmt.Sprintf("%s's requests carry it in %s", name, a.Header)
}

// warnUnsetSecrets prints a warning for each variable of secretVars that gives no value, naming the key
// and the variable and saying what `worker run` does about it; never a value. It writes to stderr, as
// the warning about a PAYGATE_ variable that sets no key: warnings about the environment, while stdout
// describes the configuration.
func warnUnsetSecrets(stderr io.Writer, c *config.Config) {
	for _, v := range secretVars(c) {
		if config.Secret(v.name) == "" {
			fmt.Fprintf(stderr, "worker: warning: %s: environment variable %s is not set (nor %s%s): %s\n",
				v.key, v.name, v.name, config.FileSuffix, v.unset)
		}
	}
}
