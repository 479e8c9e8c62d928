package config

import (
	"fmt"
	"net/url"
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

// splitAddr splits an entry of redis.addrs into its scheme ("", "redis" or "rediss") and host:port.
// ok is false for any other scheme, and for a URL carrying more than a host and port (credentials, a
// database, options): those have keys of their own.
func splitAddr(addr string) (scheme, hostPort string, ok bool) {
	if !strings.Contains(addr, "://") {
		return "", addr, true
	}
	u, err := url.Parse(addr)
	if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return "", "", false
	}
	return u.Scheme, u.Host, true
}

// TLSEnabled reports whether the gate's Redis connections use TLS: redis.tls, or rediss:// addresses.
func (r Redis) TLSEnabled() bool {
	for _, a := range r.Addrs {
		if scheme, _, _ := splitAddr(a); scheme == "rediss" {
			return true
		}
	}
	return r.TLS
}

// validate checks the addresses, their schemes against redis.tls, the CA file and the client certificate.
func (r Redis) validate(p *problems) {
	p.check(len(r.Addrs) > 0, "redis.addrs", "must list at least one host:port")
	schemes := map[string]bool{}
	for i, a := range r.Addrs {
		path := fmt.Sprintf("redis.addrs[%d]", i)
		scheme, hostPort, ok := splitAddr(a)
		switch {
		case strings.Contains(a, "@"):
			// Never echo it: what comes before the @ may be a password.
			p.add(path, "credentials never live in an address: set redis.username, and redis.password_env to the name of an environment variable holding the password")
		case !ok:
			p.add(path, "must be host:port, redis://host:port or rediss://host:port, got %q", a)
		case scheme != "" && !hostPortOK(hostPort, false):
			p.add(path, "must be %s://host:port with a port 1..65535, got %q", scheme, a)
		default:
			schemes[scheme] = true
			p.hostPort(path, hostPort)
		}
	}
	if len(schemes) > 1 {
		p.add("redis.addrs", "mixes rediss://, redis:// and bare host:port; write every address alike")
	}
	p.check(!r.TLS || !schemes["redis"], "redis.tls",
		"is true, but redis.addrs says redis:// (plaintext); use rediss:// or drop the scheme")
	if r.TLSEnabled() {
		r.tlsFiles().validate(p)
	} else {
		r.tlsFiles().refuseWithoutTLS(p, "set redis.tls: true or use rediss:// addresses")
	}
}

// Options builds go-redis options for a single node, a Redis Cluster or Sentinel, with the password read
// from the environment variable named by password_env. Addresses lose their scheme; rediss:// or
// redis.tls turns on TLS 1.2+, trusting redis.tls_ca_file or else the system's roots, and presenting the
// client certificate of redis.tls_cert_file and tls_key_file when they are set. The error is about those
// files (validated already, but read again here).
func (r Redis) Options() (*redis.UniversalOptions, error) {
	addrs := make([]string, len(r.Addrs))
	for i, a := range r.Addrs {
		_, addrs[i], _ = splitAddr(a)
	}
	o := &redis.UniversalOptions{
		Addrs:      addrs,
		MasterName: r.MasterName,
		Username:   r.Username,
		Password:   Secret(r.PasswordEnv),
		DB:         r.DB,
	}
	if r.TLSEnabled() {
		c, err := r.tlsFiles().config()
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		o.TLSConfig = c
	}
	return o, nil
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
	if r.TLSEnabled() {
		s += " tls" + r.tlsFiles().describe()
	}
	if r.PasswordEnv != "" && Secret(r.PasswordEnv) != "" {
		s += " auth from $" + r.PasswordEnv
	}
	if r.MinReplicasAcked > 0 {
		s += fmt.Sprintf(" admissions acked by %d replicas within %s", r.MinReplicasAcked, r.ReplicasAckTimeout)
	}
	return s
}
