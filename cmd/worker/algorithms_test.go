package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/internal/report"
	"github.com/paygate/paygate/internal/testenv"
)

// The algorithm family's acceptance check: for every algorithm, check-config accepts it, and 8 concurrent
// "gate try" processes at 5 per 3s on a fresh key admit exactly 5.
//
// The buckets (token_bucket, gcra) refill a unit every 600ms, and a leaky bucket leaks one: had the eight
// processes started over more than about half a second, a sixth would rightly be admitted. So each process
// is started behind a gate (a shell blocked on reading its stdin, which then execs the worker: still eight
// worker processes), and all are released at once. The default 20ms margin applies: a token bucket's burst
// is then L*W/(W+m), so its fifth unit is reserved 20ms after the first four, within --max-wait 100ms; the
// sixth is 612ms out. The leaky bucket admits into its queue, so its calls may wait for their place
// (--max-wait 3s): its queue of 5 is what admits exactly 5. Fixed windows are calendar windows: the
// processes are released just after a 3s boundary of the Redis clock, so that all eight fall in one.
func TestGateTryEveryAlgorithm(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	for _, algo := range config.Algorithms {
		t.Run(algo, func(t *testing.T) {
			cfg := testConfig(t, strings.Replace(fivePer3s, "    timeout: 10s\n", "    timeout: 10s\n    algorithm: "+algo+"\n", 1))
			r := worker(t, nil, "check-config", "--config", cfg)
			if r.code != 0 || !strings.Contains(r.stdout, algo) {
				t.Fatalf("check-config: exit %d\n%s%s", r.code, r.stdout, r.stderr)
			}
			maxWait := "100ms"
			if algo == "leaky_bucket" {
				maxWait = "3s"
			}
			type proc struct {
				cmd      *exec.Cmd
				gate     io.WriteCloser
				out, err bytes.Buffer
			}
			var procs []*proc
			for i := range 8 {
				p := &proc{cmd: exec.Command("sh", "-c", `read _; exec "$0" "$@"`, binary, "gate", "try", "--config", cfg,
					"--provider", "acme", "--id", fmt.Sprintf("job-%d", i), "--max-wait", maxWait)}
				p.cmd.Env = os.Environ()
				p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.err
				var err error
				if p.gate, err = p.cmd.StdinPipe(); err != nil {
					t.Fatal(err)
				}
				if err := p.cmd.Start(); err != nil {
					t.Fatal(err)
				}
				procs = append(procs, p)
			}
			// Release them together once the shells wait; for fixed windows, 50ms after a 3s boundary of the
			// Redis clock.
			time.Sleep(200 * time.Millisecond)
			if algo == "fixed_window" {
				now, err := rdb.Time(context.Background()).Result()
				if err != nil {
					t.Fatal(err)
				}
				time.Sleep(3*time.Second - time.Duration(now.UnixMicro()%3_000_000)*time.Microsecond + 50*time.Millisecond)
			}
			for _, p := range procs {
				p.gate.Close()
			}
			var verdicts []report.Verdict
			for _, p := range procs {
				if err := p.cmd.Wait(); err != nil {
					t.Fatalf("gate try: %v\n%s", err, p.err.String())
				}
				var v report.Verdict
				if err := json.Unmarshal(p.out.Bytes(), &v); err != nil {
					t.Fatalf("gate try printed %q: %v", p.out.String(), err)
				}
				verdicts = append(verdicts, v)
			}
			var admitted []string
			first, last := verdicts[0].Now, verdicts[0].Now
			for _, v := range verdicts {
				first, last = min(first, v.Now), max(last, v.Now)
				if v.Algorithm != algo {
					t.Fatalf("verdict of %s from %q", algo, v.Algorithm)
				}
				if v.Allowed {
					admitted = append(admitted, v.ID)
				} else if v.RetryAfterMs <= 0 || v.Limit != "5/3s" {
					t.Errorf("denial %+v: want a retry time naming 5/3s", v)
				}
			}
			spread := parseTime(t, last).Sub(parseTime(t, first))
			if len(admitted) != 5 {
				t.Fatalf("%d admitted (%v), want exactly 5; the eight asked within %v of each other", len(admitted), admitted, spread)
			}
			t.Logf("5 of 8 admitted, asked within %v", spread)
		})
	}
}

func parseTime(t *testing.T, s string) time.Time {
	t.Helper()
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

// Force is for token buckets: it admits now from an empty bucket; for any other algorithm the flag is a
// usage error naming it.
func TestGateTryForce(t *testing.T) {
	tb := testConfig(t, strings.Replace(fivePer3s, "    timeout: 10s\n", "    timeout: 10s\n    algorithm: token_bucket\n", 1))
	// One job of cost 5 empties the bucket (and runs the pace 3s ahead): the next try is denied however
	// slowly the processes start (five tries of cost 1 had to finish within one refill, 604ms).
	var v report.Verdict
	r := worker(t, nil, "gate", "try", "--config", tb, "--provider", "acme", "--id", "fill", "--cost", "5")
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &v) != nil || !v.Allowed {
		t.Fatalf("cost 5 on a full bucket: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	r = worker(t, nil, "gate", "try", "--config", tb, "--provider", "acme", "--id", "denied")
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &v) != nil || v.Allowed {
		t.Fatalf("empty bucket: exit %d %s", r.code, r.stdout)
	}
	r = worker(t, nil, "gate", "try", "--config", tb, "--provider", "acme", "--id", "must-go", "--force")
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &v) != nil || !v.Allowed || !v.Forced || v.DelayMs != 0 {
		t.Fatalf("--force on an empty bucket: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	gcra := testConfig(t, strings.Replace(fivePer3s, "    timeout: 10s\n", "    timeout: 10s\n    algorithm: gcra\n", 1))
	r = worker(t, nil, "gate", "try", "--config", gcra, "--provider", "acme", "--force")
	if r.code != 2 || r.stdout != "" || !strings.Contains(r.stderr, "--force needs algorithm token_bucket; provider acme uses gcra") {
		t.Fatalf("--force on gcra: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
}
