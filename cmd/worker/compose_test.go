package main

import (
	"bufio"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/internal/testenv"
	"github.com/paygate/paygate/providers/sim"
)

// There is no Docker engine here, so docker-compose.yml and the Dockerfile are checked against the code
// and config.yaml: every service, port, variable and command they name must be one that works.

type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Build       string            `yaml:"build"`
		Command     []string          `yaml:"command"`
		Ports       []string          `yaml:"ports"`
		Expose      []string          `yaml:"expose"`
		Environment map[string]string `yaml:"environment"`
		Volumes     []string          `yaml:"volumes"`
		Profiles    []string          `yaml:"profiles"`
		Deploy      struct {
			Replicas int `yaml:"replicas"`
		} `yaml:"deploy"`
		DependsOn       map[string]struct{ Condition string } `yaml:"depends_on"`
		StopGracePeriod string                                `yaml:"stop_grace_period"`
		Healthcheck     struct {
			Test     []string `yaml:"test"`
			Interval string   `yaml:"interval"`
			Retries  int      `yaml:"retries"`
		} `yaml:"healthcheck"`
	} `yaml:"services"`
}

var composeDefault = regexp.MustCompile(`\$\{([A-Z_]+):-([^}]*)\}`)

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	// Compose's ${VAR:-default}: check with the defaults, as "docker compose up" with nothing set runs.
	raw = composeDefault.ReplaceAll(raw, []byte("$2"))
	var c composeFile
	dec := yaml.NewDecoder(strings.NewReader(string(raw)))
	dec.KnownFields(true) // a key this test does not know is a key it does not check
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return c
}

// published reports whether a service publishes or exposes port.
func published(ports, expose []string, port string) bool {
	for _, p := range ports {
		if strings.HasSuffix(p, ":"+port) || p == port {
			return true
		}
	}
	return slices.Contains(expose, port)
}

func TestComposeFile(t *testing.T) {
	c := loadCompose(t)
	var names []string
	for n := range c.Services {
		names = append(names, n)
	}
	slices.Sort(names)
	if got := strings.Join(names, ","); got != "grafana,kafka,prometheus,provider-sim,rabbitmq,redis,worker" {
		t.Fatalf("services %s", got)
	}
	// --profile observability: Prometheus and Grafana, only when asked for, mounting files that exist.
	for _, name := range []string{"prometheus", "grafana"} {
		s := c.Services[name]
		if !slices.Equal(s.Profiles, []string{"observability"}) {
			t.Errorf("%s profiles %v, want [observability]", name, s.Profiles)
		}
		for _, v := range s.Volumes {
			src := strings.Split(v, ":")[0]
			if _, err := os.Stat(filepath.Join("../..", src)); err != nil {
				t.Errorf("%s mounts %s: %v", name, src, err)
			}
		}
	}
	w := c.Services["worker"]
	if w.Deploy.Replicas != 3 || w.Build != "." || c.Services["provider-sim"].Build != "." || w.Image == "" || c.Services["provider-sim"].Image != w.Image {
		t.Fatalf("worker: %d replicas, build %q; provider-sim build %q", w.Deploy.Replicas, w.Build, c.Services["provider-sim"].Build)
	}
	for dep, d := range w.DependsOn {
		s, ok := c.Services[dep]
		if !ok || (d.Condition == "service_healthy" && len(s.Healthcheck.Test) == 0) {
			t.Errorf("worker depends on %s (%s): not a service, or one without a health check", dep, d.Condition)
		}
	}

	// The mounted config.yaml, overridden by the worker's environment, is valid and every variable sets
	// something: a misspelt one would be silently ignored.
	if !slices.Contains(w.Volumes, "./config.yaml:"+w.Environment["PAYGATE_CONFIG"]+":ro") {
		t.Fatalf("worker volumes %v do not mount ./config.yaml at PAYGATE_CONFIG %s", w.Volumes, w.Environment["PAYGATE_CONFIG"])
	}
	var environ []string
	for k, v := range w.Environment {
		t.Setenv(k, v)
		environ = append(environ, k+"="+v)
	}
	cfg, err := config.Load("../../config.yaml")
	if err != nil {
		t.Fatalf("config.yaml with the worker's environment: %v", err)
	}
	if unknown := cfg.UnknownEnv(environ, "PAYGATE_CONFIG"); len(unknown) > 0 {
		t.Fatalf("worker variables that set nothing: %v", unknown)
	}

	// Every address the worker is given is a service publishing that port.
	hostPort := func(what, addr string) (string, string) {
		h, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatalf("%s %q: %v", what, addr, err)
		}
		s, ok := c.Services[h]
		if !ok || !published(s.Ports, s.Expose, p) {
			t.Fatalf("%s %s: no service %s publishing port %s", what, addr, h, p)
		}
		return h, p
	}
	for _, a := range cfg.Redis.Addrs {
		hostPort("redis.addrs", a)
	}
	for _, a := range cfg.Broker.Kafka.Brokers {
		hostPort("broker.kafka.brokers", a)
		if adv := c.Services["kafka"].Environment["KAFKA_ADVERTISED_LISTENERS"]; !slices.ContainsFunc(strings.Split(adv, ","), func(l string) bool { return strings.HasSuffix(l, "://"+a) }) {
			t.Errorf("kafka advertises %s, the worker dials %s", adv, a)
		}
	}
	amqpURL, err := url.Parse(config.Secret(cfg.Broker.RabbitMQ.URLEnv))
	if err != nil || amqpURL.Scheme != "amqp" {
		t.Fatalf("$%s: %v %v", cfg.Broker.RabbitMQ.URLEnv, amqpURL, err)
	}
	hostPort("$"+cfg.Broker.RabbitMQ.URLEnv, amqpURL.Host)
	rmq := c.Services["rabbitmq"].Environment
	if pass, _ := amqpURL.User.Password(); amqpURL.User.Username() != rmq["RABBITMQ_DEFAULT_USER"] || pass != rmq["RABBITMQ_DEFAULT_PASS"] {
		t.Errorf("the AMQP URL's credentials are not RabbitMQ's default user")
	}
	for name, p := range cfg.Providers {
		u, err := url.Parse(p.URL)
		if err != nil {
			t.Fatal(err)
		}
		h, port := hostPort("providers."+name+".url", u.Host)
		cmd := c.Services[h].Command
		if i := slices.Index(cmd, "--listen"); i < 0 || !strings.HasSuffix(cmd[i+1], ":"+port) {
			t.Errorf("providers.%s.url %s: service %s does not listen on %s (%v)", name, p.URL, h, port, cmd)
		}
		// The stand-in enforces exactly the limits the workers are configured with.
		var limits []string
		for _, l := range p.Limits {
			limits = append(limits, fmt.Sprintf("%d/%s", l.Requests, l.Per))
		}
		want, _ := sim.ParseLimits(strings.Join(limits, ","))
		if i := slices.Index(cmd, "--limits"); i < 0 {
			t.Errorf("service %s has no --limits", h)
		} else if got, err := sim.ParseLimits(cmd[i+1]); err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("service %s enforces %s, providers.%s.limits are %v", h, cmd[i+1], name, want)
		}
	}
	_, httpPort, _ := net.SplitHostPort(cfg.HTTP.Listen)
	if host, _, _ := net.SplitHostPort(cfg.HTTP.Listen); host != "0.0.0.0" || !published(w.Ports, w.Expose, httpPort) {
		t.Errorf("http.listen %s: must listen on all interfaces in a container and be exposed (%v)", cfg.HTTP.Listen, w.Expose)
	}
	if grace, err := time.ParseDuration(w.StopGracePeriod); err != nil || grace <= cfg.Worker.ShutdownTimeout {
		t.Errorf("stop_grace_period %q must exceed worker.shutdown_timeout %s, or in-flight jobs are killed", w.StopGracePeriod, cfg.Worker.ShutdownTimeout)
	}
}

// The commands compose runs exist with the flags it gives: the simulator is started with its exact
// arguments (on a loopback port), the worker's command answers -h.
func TestComposeCommands(t *testing.T) {
	c := loadCompose(t)
	if r := worker(t, nil, c.Services["worker"].Command[0], "-h"); r.code != 0 {
		t.Fatalf("worker %s -h: exit %d %s", c.Services["worker"].Command[0], r.code, r.stderr)
	}
	args := slices.Clone(c.Services["provider-sim"].Command)
	i := slices.Index(args, "--listen")
	args[i+1] = "127.0.0.1:0"
	cmd := exec.Command(binary, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	line, _ := bufio.NewReader(out).ReadString('\n')
	if !strings.Contains(line, "provider-sim listening on 127.0.0.1:") {
		t.Fatalf("provider-sim with compose's arguments %v printed %q", args, line)
	}
}

// The Dockerfile: multi-stage, a static build of ./cmd/worker, a non-root user, the binary it copies is
// the entrypoint, and the config it copies is the one PAYGATE_CONFIG names.
func TestDockerfile(t *testing.T) {
	raw, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(raw)
	has := func(re string) []string {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(df)
		if m == nil {
			t.Fatalf("Dockerfile: no line matching %s", re)
		}
		return m
	}
	if len(regexp.MustCompile(`(?m)^FROM `).FindAllString(df, -1)) < 2 {
		t.Fatal("Dockerfile: want a multi-stage build")
	}
	has(`(?m)^RUN CGO_ENABLED=0 go build .*-o (\S+) \./cmd/worker$`)
	bin := has(`(?m)^COPY --from=build \S+ (\S+)$`)[1]
	if entry := has(`(?m)^ENTRYPOINT \["([^"]+)"\]$`)[1]; entry != bin {
		t.Errorf("ENTRYPOINT %s, but the binary is copied to %s", entry, bin)
	}
	user := has(`(?m)^USER (\S+)$`)[1]
	if u, _, _ := strings.Cut(user, ":"); u == "root" || u == "0" {
		t.Errorf("USER %s: must not be root", user)
	}
	cfgPath := has(`(?m)^COPY config\.yaml (\S+)$`)[1]
	if env := has(`PAYGATE_CONFIG=(\S+)`)[1]; env != cfgPath {
		t.Errorf("PAYGATE_CONFIG=%s, but config.yaml is copied to %s", env, cfgPath)
	}
	if w := loadCompose(t).Services["worker"]; w.Environment["PAYGATE_CONFIG"] != cfgPath {
		t.Errorf("compose mounts the config at %s, the image keeps it at %s", w.Environment["PAYGATE_CONFIG"], cfgPath)
	}
}

// The enqueue command the compose file documents works with the worker service's environment (pointed
// at this machine's RabbitMQ, in an exchange of its own).
func TestComposeEnqueueCommand(t *testing.T) {
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`docker compose run --rm worker (enqueue[^\n#]*)`).FindSubmatch(raw)
	if m == nil {
		t.Fatal("docker-compose.yml documents no enqueue command")
	}
	args := strings.Fields(string(m[1]))
	if i := slices.Index(args, "--count"); i >= 0 {
		args[i+1] = "3"
	}
	f := newFleet(t, simProvider{name: "acme", limits: []sim.Window{{Limit: 100, Per: time.Second}}})
	var env []string
	for k, v := range loadCompose(t).Services["worker"].Environment {
		env = append(env, k+"="+v)
	}
	env = append(env, "PAYGATE_CONFIG=../../config.yaml", "PAYGATE_AMQP_URL="+testenv.AMQPURL(), "PAYGATE_REDIS_ADDRS="+testenv.RedisAddr(),
		"PAYGATE_BROKER_RABBITMQ_EXCHANGE="+f.x, "PAYGATE_WORKER_DELAY_TIERS="+strings.Join(f.tiers, ","))
	r := worker(t, env, args...)
	if r.code != 0 || !strings.Contains(r.stdout, "published 3 jobs") {
		t.Fatalf("worker %v: exit %d\n%s%s", args, r.code, r.stdout, r.stderr)
	}
	if got := f.drain(f.x + ".acme"); len(got) != 3 {
		t.Fatalf("%d jobs in %s.acme, want 3", len(got), f.x)
	}
}
