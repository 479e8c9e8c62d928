// Package testenv tells tests where the real servers they use are: the ones scripts/services.sh starts,
// unless the environment names others. One place for the variables and their defaults, so every package's
// tests reach the same servers.
package testenv

import (
	"os"
	"strings"
)

// Env is the value of the environment variable key, or def when it is unset or empty.
func Env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// RedisAddr is the single Redis node: PAYGATE_TEST_REDIS, by default 127.0.0.1:6379.
func RedisAddr() string { return Env("PAYGATE_TEST_REDIS", "127.0.0.1:6379") }

// ClusterAddrs are the Redis Cluster's nodes: PAYGATE_TEST_REDIS_CLUSTER (comma-separated), by default
// 127.0.0.1:7000-7002.
func ClusterAddrs() []string {
	return strings.Split(Env("PAYGATE_TEST_REDIS_CLUSTER", "127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002"), ",")
}

// AMQPURL is the RabbitMQ broker: PAYGATE_TEST_AMQP_URL, by default amqp://guest:guest@127.0.0.1:5672/.
func AMQPURL() string { return Env("PAYGATE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/") }

// KafkaBrokers are real Kafka brokers named by PAYGATE_TEST_KAFKA_BROKERS (comma-separated), or nil when
// it is unset: the tests then start an in-process cluster (kfake) of their own.
func KafkaBrokers() []string {
	if b := os.Getenv("PAYGATE_TEST_KAFKA_BROKERS"); b != "" {
		return strings.Split(b, ",")
	}
	return nil
}
