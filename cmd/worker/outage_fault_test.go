package main

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/internal/testenv"
	"github.com/paygate/paygate/providers/sim"
)

// outageDeferrals bounds how many times one job is deferred through an outage of d when the deferrals
// walk up tiers (consumers.gateOutage): while the outage has lasted less than the next tier, each comes
// back after the tier reached so far; one more for each tier's turn.
func outageDeferrals(tiers []time.Duration, d time.Duration) int {
	n := 0
	for i, t := range tiers {
		from, to := time.Duration(0), d
		if i > 0 {
			from = t
		}
		if i+1 < len(tiers) {
			to = min(d, tiers[i+1])
		}
		if to > from {
			n += int(math.Ceil(float64(to-from)/float64(t))) + 1
		}
	}
	return n
}

// jobsCounted reads paygate_jobs_total for one provider and outcome from /metrics text.
func jobsCounted(metrics, provider, outcome string) float64 {
	return counted(metrics, "paygate_jobs_total", "outcome", outcome, provider)
}

// Redis down for a minute under a backlog on one worker: the jobs' deferrals walk up the delay tiers
// (500ms, 2s, 5s here), so each job is deferred at most outageDeferrals times rather than once per first
// tier (120 times); the worker writes at most two lines per 10 s (its "gate unreachable" warning and
// go-redis's own, each rate-limited), where it wrote one a deferral. Once Redis is back, every job is
// dispatched exactly once, none over the limit.
func TestFaultRedisDownAMinute(t *testing.T) {
	const jobs, outage = 200, 60 * time.Second
	rp := startRedis(t)
	f := faultFleet(t, rp, simProvider{name: "acme", limits: []sim.Window{{Limit: 20, Per: time.Second}}}, jobs)
	f.startWorker()
	f.waitAccepted("acme", 20, time.Minute)
	logPath := filepath.Join(f.dir, "worker-0.log")
	before, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	deferred := jobsCounted(f.metrics(0), "acme", "gate_error")
	rp.kill()
	time.Sleep(outage)
	deferred = jobsCounted(f.metrics(0), "acme", "gate_error") - deferred
	during, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(during[len(before):])), "\n")
	rp.start()
	f.waitAccepted("acme", jobs, 2*time.Minute)
	f.stopAll()
	f.exactlyOnce("acme", jobs)

	tiers := []time.Duration{500 * time.Millisecond, 2 * time.Second, 5 * time.Second} // newFleet's
	perJob := outageDeferrals(tiers, outage)
	t.Logf("%.0f deferrals in %s (bound %d a job, %d in all; at the first tier it would be %d a job); %d log lines",
		deferred, outage, perJob, jobs*perJob, int(outage/tiers[0]), len(lines))
	if deferred == 0 || deferred > float64(jobs*perJob) {
		t.Errorf("%.0f deferrals during the outage; want some, and at most %d (%d a job)", deferred, jobs*perJob, perJob)
	}
	if maxLines := 2 * (int(outage/(10*time.Second)) + 1); len(lines) > maxLines {
		t.Errorf("%d log lines during the outage, want at most %d (two warnings per 10s):\n%s", len(lines), maxLines, strings.Join(lines, "\n"))
	}
}

// RabbitMQ credentials rotated under a running worker (its user's password changed, its connections
// cut): it keeps trying with backoff, /readyz names the cause, its warnings come at most once per 10 s a
// connection; once the password is back, it is ready again and every job goes out once.
func TestFaultCredentialsRotated(t *testing.T) {
	f := newFleet(t, simProvider{name: "acme", limits: []sim.Window{{Limit: 20, Per: time.Second}}})
	user := "paygate-" + f.x
	rabbitmqctl(t, "add_user", user, "first-Pw-1")
	t.Cleanup(func() { rabbitmqctl(t, "delete_user", user) })
	rabbitmqctl(t, "set_permissions", "-p", "/", user, ".*", ".*", ".*")
	u, err := url.Parse(testenv.AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, "first-Pw-1")
	f.env2 = append(f.env2, "PAYGATE_AMQP_URL="+u.String())
	f.enqueue("acme", 40, "j")
	f.startWorker()
	f.waitAccepted("acme", 40, time.Minute)
	ready := func() (int, string) {
		resp, err := http.Get("http://" + f.httpAddr(0) + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := ready(); code != http.StatusOK {
		t.Fatalf("/readyz %d before the rotation: %s", code, body)
	}

	rabbitmqctl(t, "change_password", user, "second-Pw-2")
	rotated := time.Now()
	if n := f.cutConnections(); n < 2 {
		t.Fatalf("cut %d connections, want the worker's 2", n)
	}
	want := fmt.Sprintf(`connection down: ACCESS_REFUSED for user %q: username or password not allowed`, user)
	f.waitFor("/readyz to name the refusal", 30*time.Second, func() bool {
		code, body := ready()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "broker: rabbitmq ") && strings.Contains(body, want)
	})
	time.Sleep(20 * time.Second) // refused all along
	rabbitmqctl(t, "change_password", user, "first-Pw-1")
	refusedFor := time.Since(rotated)
	f.waitFor("/readyz to be ready again", 45*time.Second, func() bool { code, _ := ready(); return code == http.StatusOK })
	f.enqueue("acme", 10, "k")
	f.waitAccepted("acme", 50, time.Minute)
	f.stopAll()

	logs := f.logs()
	warnings := strings.Count(logs, "rabbitmq connection failed; retrying")
	if limit := 2 * (int(refusedFor/(10*time.Second)) + 1); warnings == 0 || warnings > limit {
		t.Errorf("%d retry warnings in %s refused, want 1 to %d (one per 10s a connection)", warnings, refusedFor.Round(time.Second), limit)
	}
	if strings.Contains(logs, "first-Pw-1") || strings.Contains(logs, "second-Pw-2") {
		t.Error("the logs show a password")
	}
	if st := f.sims["acme"].Stats(); st.Accepted != 50 || st.Violations != 0 {
		t.Errorf("provider saw %+v, want 50 accepted, 0 violations", st)
	}
}
