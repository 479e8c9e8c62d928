package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/paygate/paygate/internal/report"
	"github.com/paygate/paygate/internal/testenv"
)

var binary string // the worker binary, built once by TestMain

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "paygate-worker-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "worker")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build worker: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type result struct {
	stdout, stderr string
	code           int
}

func worker(t *testing.T, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{out.String(), errb.String(), code}
}

// testConfig writes a config whose keys no other test shares.
func testConfig(t *testing.T, providers string) (path string) {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	body := fmt.Sprintf("redis:\n  addrs: [%q]\n  key_prefix: cli-%s\nproviders:\n%s", testenv.RedisAddr(), hex.EncodeToString(b[:]), providers)
	path = filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// fivePer3s is not paced (burst 5, the shortest limit's requests), so that the tests over it see each
// algorithm's own counting; TestGateTryPaced covers the default pace.
const fivePer3s = `  acme:
    url: http://127.0.0.1:8081/payments
    timeout: 10s
    limits: [{requests: 5, per: 3s}, {requests: 100, per: 1m}]
    burst: 5
`

func TestCheckConfig(t *testing.T) {
	r := worker(t, nil, "check-config", "--config", "../../config.yaml")
	if r.code != 0 || !strings.Contains(r.stdout, "acme") || !strings.Contains(r.stdout, "100/1s,3000/1m") {
		t.Fatalf("shipped config: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// No silent cap: what one process can keep in flight against the paced budget, and a prefetch that caps it.
	if want := "acme: 98.04/s paced; one process's 16 handlers fill it while a request takes under 163ms"; !strings.Contains(r.stdout, want) || strings.Contains(r.stdout, "warning") {
		t.Fatalf("shipped config: capacity line %q missing, or a warning:\n%s", want, r.stdout)
	}
	r = worker(t, []string{"PAYGATE_BROKER_RABBITMQ_PREFETCH=8"}, "check-config", "--config", "../../config.yaml")
	if want := "warning: broker.rabbitmq.prefetch 8 is below worker.concurrency 16: only 8 handlers per provider ever work"; r.code != 0 || !strings.Contains(r.stdout, want) ||
		!strings.Contains(r.stdout, "8 handlers fill it while a request takes under 82ms") {
		t.Fatalf("prefetch below concurrency: exit %d, want %q:\n%s", r.code, want, r.stdout)
	}
	r = worker(t, nil, "check-config", "--config", "../../testdata/config/bad_values.yaml")
	if r.code != 2 || r.stdout != "" || !strings.Contains(r.stderr, "providers.acme.limits[0].per: must be > 0, got 0s") {
		t.Fatalf("invalid config: exit %d\nstdout %q\nstderr %s", r.code, r.stdout, r.stderr)
	}
	r = worker(t, []string{"PAYGATE_REDIS_ADRS=10.0.0.1:6379"}, "check-config", "--config", "../../config.yaml")
	if r.code != 0 || !strings.Contains(r.stderr, "environment variable PAYGATE_REDIS_ADRS sets no configuration key") {
		t.Fatalf("a misspelt override: exit %d, stderr %q; want a warning naming it", r.code, r.stderr)
	}
	r = worker(t, nil, "check-config", "--config", "does-not-exist.yaml")
	if r.code != 2 || !strings.Contains(r.stderr, "does-not-exist.yaml") {
		t.Fatalf("missing file: exit %d %s", r.code, r.stderr)
	}
}

// A worker that could hold a RabbitMQ delivery past the broker's consumer_timeout is refused, naming
// the keys to change; Kafka has no such timeout.
func TestConsumerTimeoutCollision(t *testing.T) {
	cfg := testConfig(t, fivePer3s) // timeout 10s; defaults: prefetch 32, concurrency 16, max_inline_wait 5s
	r := worker(t, []string{"PAYGATE_BROKER_RABBITMQ_CONSUMER_TIMEOUT=1m"}, "check-config", "--config", cfg)
	want := "broker.rabbitmq.consumer_timeout: 1m0s is not more than the longest a worker can hold a delivery, 1m30s " +
		"(ceil(prefetch 32 / concurrency 16) x (5 x max_inline_wait 5s + slowest provider timeout 10s + 10s to settle))"
	if r.code != 2 || !strings.Contains(r.stderr, want) {
		t.Fatalf("exit %d, stderr %q; want 2 and %q", r.code, r.stderr, want)
	}
	for _, env := range [][]string{{"PAYGATE_BROKER_RABBITMQ_CONSUMER_TIMEOUT=91s"}, {"PAYGATE_BROKER_RABBITMQ_CONSUMER_TIMEOUT=1m", "PAYGATE_BROKER_KIND=kafka"}} {
		if r := worker(t, env, "check-config", "--config", cfg); r.code != 0 {
			t.Errorf("%v: exit %d %s", env, r.code, r.stderr)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	cfg := testConfig(t, fivePer3s)
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"gate"},
		{"gate", "try", "--config", cfg}, // no --provider
		{"gate", "try", "--config", cfg, "--provider", "nope"},                // not configured
		{"gate", "try", "--config", cfg, "--provider", "acme", "--cost", "6"}, // above the limit
		{"gate", "try", "--config", cfg, "--provider", "acme", "--bogus"},
		{"gate", "status", "--config", cfg},
		{"enqueue", "--config", cfg, "--provider", "acme", "--count", "1", "--priority", "urgent"},
		{"enqueue", "--config", cfg, "--file", "-", "--priority", "high"}, // a file's jobs give their own
	} {
		if r := worker(t, nil, args...); r.code != 2 || r.stderr == "" {
			t.Errorf("worker %v: exit %d, stderr %q; want 2 and a message", args, r.code, r.stderr)
		}
	}
}

func TestGateTryUnreachableRedis(t *testing.T) {
	cfg := testConfig(t, fivePer3s)
	r := worker(t, []string{"PAYGATE_REDIS_ADDRS=127.0.0.1:1"}, "gate", "try", "--config", cfg, "--provider", "acme")
	if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, "gate: reserve acme/") {
		t.Fatalf("exit %d stdout %q stderr %s", r.code, r.stdout, r.stderr)
	}
}

// tryConcurrently runs n "gate try" processes for provider acme at once, ids prefix-0..prefix-(n-1), and
// returns every verdict (the test fails unless each printed one).
func tryConcurrently(t *testing.T, cfg string, n int, prefix string, flags ...string) []report.Verdict {
	t.Helper()
	var (
		wg sync.WaitGroup
		mu sync.Mutex
		vs []report.Verdict
	)
	for i := range n {
		wg.Go(func() {
			args := append([]string{"gate", "try", "--config", cfg, "--provider", "acme", "--id", fmt.Sprintf("%s-%d", prefix, i)}, flags...)
			r := worker(t, nil, args...)
			var v report.Verdict
			if r.code != 0 || json.Unmarshal([]byte(r.stdout), &v) != nil {
				t.Errorf("exit %d stdout %q stderr %s", r.code, r.stdout, r.stderr)
				return
			}
			mu.Lock()
			vs = append(vs, v)
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(vs) != n {
		t.FailNow()
	}
	return vs
}

// The acceptance check: 20 concurrent "gate try" processes at 5 per 3s admit exactly 5, and the
// same id again is a duplicate.
func TestGateTryConcurrent(t *testing.T) {
	cfg := testConfig(t, fivePer3s)
	verdicts := tryConcurrently(t, cfg, 20, "job")
	var admitted []string
	for _, v := range verdicts {
		if v.Allowed {
			admitted = append(admitted, v.ID)
		} else if v.RetryAfterMs <= 0 || v.RetryAfterMs > 3021 || v.Policy != 0 || v.Limit != "5/3s" {
			// At most the window plus gate.margin (20ms) plus the rounding up to the millisecond: a denial
			// that comes right after the first admission waits for all of it.
			t.Errorf("denial %+v: want retry_after_ms in (0, 3021] naming 5/3s", v)
		}
	}
	if len(verdicts) != 20 || len(admitted) != 5 {
		t.Fatalf("%d verdicts, %d admitted (%v); want 20 and exactly 5", len(verdicts), len(admitted), admitted)
	}
	r := worker(t, nil, "gate", "try", "--config", cfg, "--provider", "acme", "--id", admitted[0])
	var raw map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &raw); err != nil {
		t.Fatal(err)
	}
	// The public keys, written exactly so.
	for _, k := range []string{"allowed", "duplicate", "delay_ms", "retry_after_ms", "remaining", "policy"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("key %q missing from %s", k, r.stdout)
		}
	}
	if raw["allowed"] != true || raw["duplicate"] != true {
		t.Fatalf("same id again: %s, want allowed duplicate", r.stdout)
	}

	r = worker(t, nil, "gate", "status", "--config", cfg, "--provider", "acme", "--json")
	var st report.Status
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || r.code != 0 {
		t.Fatalf("status: exit %d %q %v", r.code, r.stdout, err)
	}
	if st.Units != 5 || st.Policies[0].Used != 5 || st.Policies[0].Remaining != 0 || st.Policies[1].Remaining != 95 ||
		st.MarginMs != 20 || st.MarginFloorMs != 20 || st.MarginMaxMs != 100 || st.MarginWhy != "floor" {
		t.Fatalf("status %+v", st)
	}
	r = worker(t, nil, "gate", "status", "--config", cfg, "--provider", "acme")
	if r.code != 0 || !strings.Contains(r.stdout, "5/3s") || !strings.Contains(r.stdout, "REMAINING") ||
		!strings.Contains(r.stdout, "margin in force 20ms (gate.margin 20ms, gate.margin_max 100ms): floor") {
		t.Fatalf("status table: %s", r.stdout)
	}
}

// Paced by default: "gate try" processes asking together at 5 per 3s (margin 20ms) are handed slots a pace,
// (3s + 20ms) / 5 = 604ms, apart, never two at one moment. Asking for now only, one is admitted and the
// others are told to come back within a pace.
func TestGateTryPaced(t *testing.T) {
	if r := worker(t, nil, "check-config", "--config", testConfig(t, fivePer3s)); r.code != 0 || !strings.Contains(r.stdout, "none (burst = the limit)") {
		t.Fatalf("check-config of a burst of the whole limit: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	cfg := testConfig(t, strings.Replace(fivePer3s, "    burst: 5\n", "", 1))
	if r := worker(t, nil, "check-config", "--config", cfg); r.code != 0 || !strings.Contains(r.stdout, "every 604ms") {
		t.Fatalf("check-config: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	const pace = 604 * time.Millisecond
	ask := func(prefix, maxWait string) []report.Verdict {
		return tryConcurrently(t, cfg, 5, prefix, "--max-wait", maxWait)
	}
	admitted := 0
	for _, v := range ask("now", "0s") {
		switch {
		case v.Allowed:
			admitted++
		case v.RetryAfterMs <= 0 || time.Duration(v.RetryAfterMs)*time.Millisecond > pace+time.Millisecond:
			t.Errorf("denial %+v: want a retry within one pace (%v)", v, pace)
		}
	}
	if admitted != 1 {
		t.Fatalf("%d of 5 admitted asking for now; want 1", admitted)
	}
	var slots []time.Time
	for _, v := range ask("later", "5s") {
		if !v.Allowed {
			t.Fatalf("denied within 5s: %+v", v)
		}
		slots = append(slots, parseTime(t, v.Now).Add(time.Duration(v.DelayMs*1000)*time.Microsecond))
	}
	slices.SortFunc(slots, func(a, b time.Time) int { return a.Compare(b) })
	for i := 1; i < len(slots); i++ {
		if gap := slots[i].Sub(slots[i-1]); gap < pace-time.Microsecond || gap > pace+time.Microsecond {
			t.Errorf("slot %d is %v after slot %d, want %v", i, gap, i-1, pace)
		}
	}
}

func TestRunInProcess(t *testing.T) {
	// run() maps errors to exit codes without a subprocess; help is a success.
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"help"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "check-config") {
		t.Fatalf("help: %d %q", code, out.String())
	}
}

// The providers issue's acceptance check, through the binary: --limits 3/2s answers five quick POSTs with
// distinct keys 200 200 200 429 429, a replay of the first key 200, and /stats shows 3, 1, 2.
func TestProviderSimCLI(t *testing.T) {
	cmd := exec.Command(binary, "provider-sim", "--listen", "127.0.0.1:0", "--limits", "3/2s")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("no banner: %v %s", err, stderr.String())
	}
	m := regexp.MustCompile(`listening on (\S+)`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("banner %q", line)
	}
	base := "http://" + m[1]
	var codes []int
	for _, k := range []string{"k1", "k2", "k3", "k4", "k5", "k1"} {
		req, _ := http.NewRequest(http.MethodPost, base+"/payments", strings.NewReader(`{"id":"x"}`))
		req.Header.Set("Idempotency-Key", k)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	if fmt.Sprint(codes) != "[200 200 200 429 429 200]" {
		t.Fatalf("codes %v", codes)
	}
	resp, err := http.Get(base + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	var st struct{ Accepted, Duplicates, Violations int }
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || st.Accepted != 3 || st.Duplicates != 1 || st.Violations != 2 {
		t.Fatalf("stats %+v %v", st, err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v %s", err, stderr.String())
	}
}

func TestProviderSimBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"provider-sim"},
		{"provider-sim", "--limits", "3/x"},
		{"provider-sim", "--limits", "3/1s", "--error-rate", "1.5"},
		{"provider-sim", "--limits", "3/1s", "--latency", "1ms", "--jitter", "5ms"},
		{"provider-sim", "--limits", "3/1s", "--max-in-flight", "-1"},
	} {
		if r := worker(t, nil, args...); r.code != 2 || r.stderr == "" {
			t.Errorf("%v: exit %d %q", args, r.code, r.stderr)
		}
	}
}
