package config

import (
	"crypto/tls"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Mode names how the Redis addresses are used: "single", "cluster" or "sentinel".
func (r Redis) Mode() string {
	switch {
	case r.MasterName != "":
		return "sentinel"
	case len(r.Addrs) > 1:
		return "cluster"
	default:
		return "single"
	}
}

// Options builds go-redis options for a single node, a Redis Cluster or Sentinel, with the password read
// from the environment variable named by password_env.
func (r Redis) Options() *redis.UniversalOptions {
	o := &redis.UniversalOptions{
		Addrs:      r.Addrs,
		MasterName: r.MasterName,
		Username:   r.Username,
		Password:   Secret(r.PasswordEnv),
		DB:         r.DB,
	}
	if r.TLS {
		o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return o
}

// String describes the connection without secrets, for logs and check-config.
func (r Redis) String() string {
	s := fmt.Sprintf("%s %s", r.Mode(), strings.Join(r.Addrs, ","))
	if r.MasterName != "" {
		s += " master " + r.MasterName
	}
	if r.DB != 0 {
		s += fmt.Sprintf(" db %d", r.DB)
	}
	if r.TLS {
		s += " tls"
	}
	if r.PasswordEnv != "" && Secret(r.PasswordEnv) != "" {
		s += " auth from $" + r.PasswordEnv
	}
	return s
}
