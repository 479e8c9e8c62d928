package main

import (
	"bytes"
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// check-config warns, on stderr and with exit status 0, about every secret the configuration names that its
// environment does not give (neither the variable nor its _FILE companion), naming the key and the
// variable and saying what `worker run` does; never a value. Where a warning says run stops with status 2,
// run is started with the same environment and does.
func TestCheckConfigUnsetSecrets(t *testing.T) {
	const (
		amqpURL   = "amqp://pg:Amqp-s3cret@127.0.0.1:1/"
		redisPass = "R3dis-s3cret"
		token     = "Bearer Tok-s3cret"
	)
	secretFile := func(t *testing.T, value string) string {
		path := filepath.Join(t.TempDir(), "secret")
		if err := os.WriteFile(path, []byte(value+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	kafkaSASL := map[string]string{"PAYGATE_BROKER_KIND": "kafka", "PAYGATE_BROKER_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
		"PAYGATE_BROKER_KAFKA_SASL_USERNAME": "svc-paygate"}
	acmeAuth := map[string]string{"PAYGATE_PROVIDERS_ACME_AUTH_HEADER": "Authorization", "PAYGATE_PROVIDERS_ACME_AUTH_ENV": "ACME_TEST_TOKEN"}
	tests := []struct {
		name string
		env  func(t *testing.T) map[string]string
		want map[string]string // key -> a part of its warning line: what run does
		exit int               // what worker run exits with in this environment (0: not run here)
	}{
		{name: "nothing set, rabbitmq",
			env: func(*testing.T) map[string]string { return nil },
			want: map[string]string{"redis.password_env": "connects to Redis without a password",
				"broker.rabbitmq.url_env": "worker run and enqueue stop at start with exit status 2"},
			exit: 2},
		{name: "every secret in its variable",
			env: func(*testing.T) map[string]string {
				return unionEnv(acmeAuth, map[string]string{"PAYGATE_AMQP_URL": amqpURL, "PAYGATE_REDIS_PASSWORD": redisPass, "ACME_TEST_TOKEN": token})
			},
			want: map[string]string{}},
		{name: "every secret from a _FILE",
			env: func(t *testing.T) map[string]string {
				return unionEnv(acmeAuth, map[string]string{"PAYGATE_AMQP_URL_FILE": secretFile(t, amqpURL),
					"PAYGATE_REDIS_PASSWORD_FILE": secretFile(t, redisPass), "ACME_TEST_TOKEN_FILE": secretFile(t, token)})
			},
			want: map[string]string{}},
		{name: "an empty _FILE gives no value",
			env: func(t *testing.T) map[string]string {
				return map[string]string{"PAYGATE_AMQP_URL_FILE": secretFile(t, ""), "PAYGATE_REDIS_PASSWORD": redisPass}
			},
			want: map[string]string{"broker.rabbitmq.url_env": "exit status 2 (the AMQP URL has no default)"},
			exit: 2},
		{name: "no redis.password_env, no warning about it",
			env: func(*testing.T) map[string]string {
				return map[string]string{"PAYGATE_REDIS_PASSWORD_ENV": "", "PAYGATE_AMQP_URL": amqpURL}
			},
			want: map[string]string{}},
		{name: "kafka without sasl reads no secret but Redis's",
			env:  func(*testing.T) map[string]string { return map[string]string{"PAYGATE_BROKER_KIND": "kafka"} },
			want: map[string]string{"redis.password_env": "connects to Redis without a password"}},
		{name: "kafka sasl without its password",
			env: func(*testing.T) map[string]string {
				return unionEnv(kafkaSASL, map[string]string{"PAYGATE_REDIS_PASSWORD": redisPass})
			},
			want: map[string]string{"broker.kafka.sasl.password_env": `exit status 2 (the SCRAM-SHA-512 password of user "svc-paygate")`},
			exit: 2},
		{name: "kafka sasl with its password",
			env: func(*testing.T) map[string]string {
				return unionEnv(kafkaSASL, map[string]string{"PAYGATE_REDIS_PASSWORD": redisPass, "PAYGATE_KAFKA_PASSWORD": "Kafka-s3cret"})
			},
			want: map[string]string{}},
		{name: "a provider's auth_env unset",
			env: func(*testing.T) map[string]string {
				return unionEnv(acmeAuth, map[string]string{"PAYGATE_AMQP_URL": amqpURL, "PAYGATE_REDIS_PASSWORD": redisPass})
			},
			want: map[string]string{"providers.acme.auth_env": "worker run stops at start with exit status 2 (acme's requests carry it in Authorization)"},
			exit: 2},
	}
	cfg := testConfig(t, fivePer3s)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := tc.env(t)
			setSecretEnv(t, env)
			var stdout, stderr bytes.Buffer
			if err := checkConfig([]string{"--config", cfg}, &stdout, &stderr); err != nil {
				t.Fatalf("check-config: %v\n%s", err, stderr.String())
			}
			got := secretWarnings(stderr.String())
			if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, slices.Sorted(maps.Keys(tc.want))) {
				t.Fatalf("warnings for %v, want %v; stderr:\n%s", keys, slices.Sorted(maps.Keys(tc.want)), stderr.String())
			}
			for key, line := range got {
				name := warnedVar(key, env)
				if want := "environment variable " + name + " is not set (nor " + name + "_FILE): "; !strings.Contains(line, want) || !strings.Contains(line, tc.want[key]) {
					t.Errorf("warning %q; want it to say %q and %q", line, want, tc.want[key])
				}
			}
			if !strings.Contains(stdout.String(), ": valid\n") || strings.Contains(stdout.String(), "is not set (nor") {
				t.Errorf("stdout is the configuration's report, without the environment's warnings:\n%s", stdout.String())
			}
			for _, secret := range []string{"Amqp-s3cret", redisPass, "Tok-s3cret", "Kafka-s3cret"} {
				if strings.Contains(stdout.String()+stderr.String(), secret) {
					t.Errorf("a secret in check-config's output:\n%s%s", stdout.String(), stderr.String())
				}
			}
			if tc.exit != 0 {
				var names []string
				for key := range got {
					names = append(names, warnedVar(key, env))
				}
				checkRunExits(t, cfg, tc.exit, names)
			}
		})
	}
}

// setSecretEnv gives every variable the cases use a value for this test ("" where env has none: unset, for
// config.Secret) and env's over them.
func setSecretEnv(t *testing.T, env map[string]string) {
	t.Helper()
	for _, name := range []string{"PAYGATE_REDIS_PASSWORD", "PAYGATE_AMQP_URL", "PAYGATE_KAFKA_PASSWORD", "ACME_TEST_TOKEN"} {
		t.Setenv(name, env[name])
		t.Setenv(name+"_FILE", env[name+"_FILE"])
	}
	t.Setenv("PAYGATE_BROKER_KIND", "rabbitmq")
	t.Setenv("PAYGATE_HTTP_LISTEN", "127.0.0.1:0") // for worker run
	for k, v := range env {
		t.Setenv(k, v)
	}
}

// secretWarnings returns check-config's warnings about unset secrets by key.
func secretWarnings(stderr string) map[string]string {
	got := map[string]string{}
	for line := range strings.Lines(stderr) {
		rest, ok := strings.CutPrefix(line, "worker: warning: ")
		if key, _, found := strings.Cut(rest, ": environment variable "); ok && found {
			got[key] = strings.TrimSuffix(line, "\n")
		}
	}
	return got
}

// warnedVar is the variable the warning about key must name.
func warnedVar(key string, env map[string]string) string {
	switch key {
	case "redis.password_env":
		return "PAYGATE_REDIS_PASSWORD"
	case "broker.rabbitmq.url_env":
		return "PAYGATE_AMQP_URL"
	case "broker.kafka.sasl.password_env":
		return "PAYGATE_KAFKA_PASSWORD"
	}
	return env["PAYGATE_PROVIDERS_ACME_AUTH_ENV"]
}

// checkRunExits starts worker run (in this process, with this environment) and checks it stops at once
// with exit status want, naming one of the variables check-config warned about.
func checkRunExits(t *testing.T, cfg string, want int, warned []string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr bytes.Buffer
	if code := run(ctx, []string{"run", "--config", cfg}, &stdout, &stderr); code != want {
		t.Fatalf("worker run: exit %d, want %d (as check-config warns)\n%s", code, want, stderr.String())
	}
	if !slices.ContainsFunc(warned, func(name string) bool { return strings.Contains(stderr.String(), "variable "+name+" ") }) {
		t.Errorf("worker run's message names none of %v:\n%s", warned, stderr.String())
	}
}

// unionEnv is the union of environments, the later ones winning.
func unionEnv(envs ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, e := range envs {
		maps.Copy(out, e)
	}
	return out
}
