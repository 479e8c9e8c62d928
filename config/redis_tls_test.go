package config_test

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/testenv"
	"github.com/paygate/paygate/internal/testtls"
)

// The gate works through rediss:// with the CA file: real Redis behind a TLS proxy that presents a
// certificate of a CA made for the test. Without the CA file the same address fails with an unknown
// authority, and nothing reaches Redis: TLS is never given up for plain text.
func TestGateThroughRediss(t *testing.T) {
	ca := testtls.NewCA(t)
	proxy := ca.Proxy(t, testenv.RedisAddr())
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "tls-" + hex.EncodeToString(b[:])
	policies := map[string]gate.Provider{"acme": {Policies: []gate.Policy{{Limit: 2, Window: time.Minute}}}}
	limiter := func(t *testing.T, yaml string) *gate.Limiter {
		c, err := config.Load(writeFile(t, yaml+"\n"+oneProvider))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { // in plain text, straight to Redis
			rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
			defer rdb.Close()
			l, _ := gate.New(rdb, gate.Options{Prefix: c.Redis.KeyPrefix, Providers: policies})
			keys, _ := l.Keys("acme")
			rdb.Del(context.Background(), keys...)
		})
		o, err := c.Redis.Options()
		if err != nil {
			t.Fatal(err)
		}
		rdb := redis.NewUniversalClient(o)
		t.Cleanup(func() { rdb.Close() })
		l, err := gate.New(rdb, gate.Options{Prefix: c.Redis.KeyPrefix, Providers: policies})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	t.Run("without the CA", func(t *testing.T) {
		l := limiter(t, "redis: {addrs: ['rediss://"+proxy.Addr+"'], key_prefix: "+prefix+"-0}")
		_, err := l.Reserve(ctx, "acme", "pay-1", 1, 0)
		var unknown x509.UnknownAuthorityError
		if !errors.As(err, &unknown) || !strings.HasPrefix(err.Error(), "gate: reserve acme/pay-1") {
			t.Fatalf("got %v, want the gate's error wrapping an unknown authority", err)
		}
		if proxy.Forwarded() != 0 {
			t.Fatalf("%d connections reached Redis without a verified handshake", proxy.Forwarded())
		}
	})
	t.Run("with the CA", func(t *testing.T) {
		for _, yaml := range []string{
			"redis: {addrs: ['rediss://" + proxy.Addr + "'], tls_ca_file: " + ca.File + ", key_prefix: " + prefix + "-1}",
			"redis: {addrs: ['" + proxy.Addr + "'], tls: true, tls_ca_file: " + ca.File + ", key_prefix: " + prefix + "-2}",
		} {
			l := limiter(t, yaml)
			for i, id := range []string{"pay-1", "pay-2", "pay-3"} {
				v, err := l.Reserve(ctx, "acme", id, 1, 0)
				if err != nil {
					t.Fatalf("%s: %v", yaml, err)
				}
				if want := i < 2; v.Allowed != want || v.Duplicate {
					t.Fatalf("%s: %s allowed %v duplicate %v, want allowed %v (2 per minute)", yaml, id, v.Allowed, v.Duplicate, want)
				}
			}
		}
		if proxy.Forwarded() == 0 {
			t.Fatal("the proxy forwarded nothing")
		}
	})
}
