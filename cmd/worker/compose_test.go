package main

import (
	"bufio"
	"fmt"
	"maps"
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
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"` // named volumes (their options: none here)
	Secrets  map[string]struct {
		File string `yaml:"file"`
	} `yaml:"secrets"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       string            `yaml:"build"`
	Hostname    string            `yaml:"hostname"`
	Command     []string          `yaml:"command"`
	Ports       []string          `yaml:"ports"`
	Expose      []string          `yaml:"expose"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Secrets     []string          `yaml:"secrets"`
	Profiles    []string          `yaml:"profiles"`
	Restart     string            `yaml:"restart"`
	Deploy      struct {
		Replicas int `yaml:"replicas"`
	} `yaml:"deploy"`
	DependsOn map[string]struct {
		Condition string `yaml:"condition"`
		Required  *bool  `yaml:"required"` // Compose 2.20+: false, not started nor waited for unless its profile is
	} `yaml:"depends_on"`
	StopGracePeriod string `yaml:"stop_grace_period"`
	Healthcheck     struct {
		Test        []string `yaml:"test"`
		Interval    string   `yaml:"interval"`
		Timeout     string   `yaml:"timeout"`
		Retries     int      `yaml:"retries"`
		StartPeriod string   `yaml:"start_period"`
	} `yaml:"healthcheck"`
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
	cfg := composeWorkerConfig(t, w)

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
		"PAYGATE_REDIS_PASSWORD_FILE=", // the compose secret's path is not here, nor does this machine's Redis want a password
		"PAYGATE_BROKER_RABBITMQ_EXCHANGE="+f.x, "PAYGATE_WORKER_DELAY_TIERS="+strings.Join(f.tiers, ","))
	r := worker(t, env, args...)
	if r.code != 0 || !strings.Contains(r.stdout, "published 3 jobs") {
		t.Fatalf("worker %v: exit %d\n%s%s", args, r.code, r.stdout, r.stderr)
	}
	if got := f.drain(f.x + ".acme"); len(got) != 3 {
		t.Fatalf("%d jobs in %s.acme, want 3", len(got), f.x)
	}
}

// composeWorkerConfig loads config.yaml with the worker service's environment, as a replica would (a
// /run/secrets/ file it names stands in a file of the test's), and checks every variable sets something:
// a misspelt one would be silently ignored.
func composeWorkerConfig(t *testing.T, w composeService) *config.Config {
	t.Helper()
	var environ []string
	for k, v := range w.Environment {
		if strings.HasPrefix(v, "/run/secrets/") {
			v = filepath.Join(t.TempDir(), filepath.Base(v))
			if err := os.WriteFile(v, []byte("not-the-password\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
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
	return cfg
}

// Production shape: no port is published on every interface, only on 127.0.0.1 (host:published:container).
func TestComposePortsOnLoopback(t *testing.T) {
	for name, s := range loadCompose(t).Services {
		for _, p := range s.Ports {
			if parts := strings.Split(p, ":"); len(parts) != 3 || parts[0] != "127.0.0.1" {
				t.Errorf("%s publishes %q: want 127.0.0.1:<port>:<port>, never all interfaces", name, p)
			}
		}
	}
}

// Kafka runs only under its profile, and nothing outside that profile requires it: a RabbitMQ deployment
// neither starts nor waits for it. The header says how to start it.
func TestComposeKafkaProfile(t *testing.T) {
	c := loadCompose(t)
	if p := c.Services["kafka"].Profiles; !slices.Equal(p, []string{"kafka"}) {
		t.Errorf("kafka profiles %v, want [kafka]", p)
	}
	for name, s := range c.Services {
		for dep, d := range s.DependsOn {
			if extra := slices.DeleteFunc(slices.Clone(c.Services[dep].Profiles), func(p string) bool { return slices.Contains(s.Profiles, p) }); len(extra) > 0 && (d.Required == nil || *d.Required) {
				t.Errorf("%s depends on %s, which runs only under profile %v: want required: false", name, dep, extra)
			}
		}
	}
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^#\s+PAYGATE_BROKER_KIND=kafka docker compose --profile kafka up`).Match(raw) {
		t.Error("the header does not say how to run on Kafka: PAYGATE_BROKER_KIND=kafka docker compose --profile kafka up")
	}
}

// Redis keeps the gate's state: an append-only file synced every second on a named volume, and a password
// that comes from a compose secret (the server's, its health check's and the workers', who get it through
// the _FILE form of redis.password_env's variable).
func TestComposeRedis(t *testing.T) {
	c := loadCompose(t)
	r := c.Services["redis"]
	cmd := strings.Join(r.Command, " ")
	for _, want := range []string{"redis-server", "--appendonly yes", "--appendfsync everysec", "--requirepass"} {
		if !strings.Contains(cmd, want) {
			t.Errorf("redis command %q: no %q", cmd, want)
		}
	}
	if vol, _, _ := strings.Cut(composeMount(r.Volumes, "/data"), ":"); !slices.Contains(slices.Collect(maps.Keys(c.Volumes)), vol) {
		t.Errorf("redis volumes %v: want a named volume at /data (the append-only file)", r.Volumes)
	}
	if len(r.Secrets) != 1 || c.Secrets[r.Secrets[0]].File == "" {
		t.Fatalf("redis secrets %v: want one, a file declared under secrets", r.Secrets)
	}
	secret := "/run/secrets/" + r.Secrets[0]
	if !regexp.MustCompile(`\$\(cat ` + regexp.QuoteMeta(secret) + `\)`).MatchString(cmd) {
		t.Errorf("redis command %q: the password is not read from %s", cmd, secret)
	}
	if hc := strings.Join(r.Healthcheck.Test, " "); !strings.Contains(hc, "REDISCLI_AUTH=") || !strings.Contains(hc, secret) {
		t.Errorf("redis health check %q: does not authenticate with %s", hc, secret)
	}
	w := c.Services["worker"]
	cfg := config.Default()
	if v := cfg.Redis.PasswordEnv + config.FileSuffix; w.Environment[v] != secret || !slices.Contains(w.Secrets, r.Secrets[0]) {
		t.Errorf("worker: %s=%q, secrets %v; want %s from the secret %s", v, w.Environment[v], w.Secrets, secret, r.Secrets[0])
	}
}

// composeMount is the volume entry of vols mounted at target ("" if none).
func composeMount(vols []string, target string) string {
	for _, v := range vols {
		if parts := strings.Split(v, ":"); len(parts) >= 2 && parts[1] == target {
			return v
		}
	}
	return ""
}

// Every secret's file exists, or is left out of the repository and the compose header and
// docs/operations.md both give the command that creates it.
func TestComposeSecrets(t *testing.T) {
	c := loadCompose(t)
	header, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	ops, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range c.Secrets {
		if _, err := os.Stat(filepath.Join("../..", s.File)); err == nil {
			continue
		}
		create := regexp.MustCompile(`> ` + regexp.QuoteMeta(strings.TrimPrefix(s.File, "./")) + `\b`)
		if !create.Match(header) || !create.Match(ops) {
			t.Errorf("secret %s: %s does not exist, and the compose header and docs/operations.md do not both say how to create it", name, s.File)
		}
	}
}

// Health checks on every server the workers wait for and on the worker itself: its /readyz, on the port of
// http.listen, asked by the image's own binary (`worker probe`: the image is distroless, without an HTTP
// client), at the path the Dockerfile puts it.
func TestComposeHealthchecks(t *testing.T) {
	c := loadCompose(t)
	for _, name := range []string{"redis", "rabbitmq", "kafka", "worker"} {
		if hc := c.Services[name].Healthcheck; len(hc.Test) < 2 || (hc.Test[0] != "CMD" && hc.Test[0] != "CMD-SHELL") {
			t.Errorf("%s: no health check (%v)", name, hc.Test)
		}
	}
	w := c.Services["worker"]
	_, port, _ := net.SplitHostPort(w.Environment["PAYGATE_HTTP_LISTEN"])
	test := w.Healthcheck.Test
	if !slices.Contains(test, "http://127.0.0.1:"+port+"/readyz") || test[0] != "CMD" {
		t.Fatalf("worker health check %v: want CMD ... http://127.0.0.1:%s/readyz", test, port)
	}
	dockerfile, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(dockerfile), "ENTRYPOINT [\""+test[1]+"\"]") || test[2] != "probe" {
		t.Fatalf("worker health check %v: want the image's entrypoint (the Dockerfile's) running probe", test)
	}
}

// A shell's $ in a command or health check is written $$: compose substitutes a lone $NAME or $(...) from
// the host's environment before the shell sees it (the Redis password would be read as empty).
func TestComposeShellDollars(t *testing.T) {
	lone := regexp.MustCompile(`(^|[^$])\$[A-Za-z_({]`)
	for name, s := range loadCompose(t).Services {
		for _, arg := range append(slices.Clone(s.Command), s.Healthcheck.Test...) {
			if m := lone.FindString(strings.ReplaceAll(arg, "$$", "")); m != "" {
				t.Errorf("%s: %q has a lone $ (%q) that compose would substitute: write $$", name, arg, m)
			}
		}
	}
}
