package main

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/internal/testenv"
	"github.com/paygate/paygate/providers/sim"
)

const (
	redisPassword  = "Redis-s3cret-Pw"
	wrongPassword  = "Wr0ng-Passw0rd"
	limitedUser    = "limited"
	limitedPasswrd = "Limited-Pw-1"
)

// passwordRedis starts a redis-server of the test's own that wants redisPassword, with a user that may
// only PING (limitedUser), and returns its address.
func passwordRedis(t *testing.T) string {
	t.Helper()
	rp := startRedisWith(t, redisPassword)
	rp.do("ACL", "SETUSER", limitedUser, "on", ">"+limitedPasswrd, "~*", "-@all", "+ping", "+hello", "+auth")
	return rp.addr()
}

// What no retry mends stops `worker run` and the operator's tools at start: status 2 within 5 s, and a
// last line naming the setting to fix, never the password. RabbitMQ is the real one; Redis is one of the
// test's own that wants a password.
func TestStartRefusals(t *testing.T) {
	f := newFleet(t, simProvider{name: "acme", limits: []sim.Window{{Limit: 5, Per: time.Second}}})
	amqpWith := func(mutate func(u *url.URL)) string {
		u, err := url.Parse(testenv.AMQPURL())
		if err != nil {
			t.Fatal(err)
		}
		mutate(u)
		return u.String()
	}
	user := func() string { u, _ := url.Parse(testenv.AMQPURL()); return u.User.Username() }()
	wrongAMQP := "PAYGATE_AMQP_URL=" + amqpWith(func(u *url.URL) { u.User = url.UserPassword(user, wrongPassword) })
	noVhost := "PAYGATE_AMQP_URL=" + amqpWith(func(u *url.URL) { u.Path = "/paygate-no-such-vhost" })
	httpURL := "PAYGATE_AMQP_URL=" + amqpWith(func(u *url.URL) { u.Scheme = "http" })
	rdb := passwordRedis(t)
	withRedis := func(env ...string) []string {
		return append([]string{"PAYGATE_AMQP_URL=" + testenv.AMQPURL(), "PAYGATE_REDIS_ADDRS=" + rdb, "PAYGATE_REDIS_PASSWORD_FILE="}, env...)
	}
	run := []string{"run", "--config", f.cfg}
	enqueue := []string{"enqueue", "--config", f.cfg, "--provider", "acme", "--count", "1"}
	dashboard := []string{"dashboard", "--config", f.cfg, "--listen", "127.0.0.1:0"}
	status := []string{"gate", "status", "--config", f.cfg, "--provider", "acme"}
	refusedAMQP := `broker.rabbitmq.url_env: RabbitMQ refused the URL in $PAYGATE_AMQP_URL: ACCESS_REFUSED for user "` + user + `": username or password not allowed`
	tests := []struct {
		name string
		args []string
		env  []string
		want string // the last line, after "worker: "
	}{
		{"run: a wrong AMQP password", run, []string{wrongAMQP}, refusedAMQP},
		{"enqueue: a wrong AMQP password", enqueue, []string{wrongAMQP}, refusedAMQP},
		{"dashboard: a wrong AMQP password", dashboard, []string{wrongAMQP}, refusedAMQP},
		{"run: an unknown vhost", run, []string{noVhost},
			`broker.rabbitmq.url_env: RabbitMQ refused the URL in $PAYGATE_AMQP_URL: NOT_ALLOWED for user "` + user + `" on vhost "paygate-no-such-vhost": NOT_ALLOWED - vhost paygate-no-such-vhost not found`},
		{"run: not an AMQP URL", run, []string{httpURL},
			`broker.rabbitmq.url_env: RabbitMQ refused the URL in $PAYGATE_AMQP_URL: not an AMQP URL (amqp://user:pass@host:5672/vhost or amqps://…), scheme http://: AMQP scheme must be either 'amqp://' or 'amqps://'`},
		{"run: a wrong Redis password", run, withRedis("PAYGATE_REDIS_PASSWORD=" + wrongPassword),
			`redis.password_env: Redis refused user "default" with the password in $PAYGATE_REDIS_PASSWORD (WRONGPASS)`},
		{"gate status: no Redis password", status, withRedis("PAYGATE_REDIS_PASSWORD="),
			`redis.password_env: Redis wants a password (NOAUTH), and $PAYGATE_REDIS_PASSWORD is not set`},
		{"run: a Redis user without the gate's permissions", run,
			withRedis("PAYGATE_REDIS_USERNAME="+limitedUser, "PAYGATE_REDIS_PASSWORD="+limitedPasswrd),
			`redis.username: user "limited" lacks a permission the gate needs (NOPERM`},
		{"enqueue needs no Redis: a wrong AMQP password still stops it", enqueue,
			append(withRedis("PAYGATE_REDIS_PASSWORD="+wrongPassword), wrongAMQP), refusedAMQP},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			r := worker(t, tt.env, tt.args...)
			took := time.Since(start)
			lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
			last := lines[len(lines)-1]
			if r.code != 2 || !strings.HasPrefix(last, "worker: "+tt.want) || took > 5*time.Second {
				t.Fatalf("status %d after %s, last line:\n%s\nwant status 2 within 5s, starting:\nworker: %s", r.code, took, last, tt.want)
			}
			for _, secret := range []string{wrongPassword, redisPassword, limitedPasswrd} {
				if strings.Contains(r.stdout+r.stderr, secret) {
					t.Fatalf("the output shows a password:\n%s", r.stderr)
				}
			}
			t.Logf("status 2 after %s: %s", took.Round(time.Millisecond), last)
		})
	}
}
