package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paygate/paygate/providers/sim"
)

const serviceToken = "e2e-gate-token-0123456789"

// startGateService runs `worker gate serve` for the fleet's configuration and returns its base URL.
func (f *fleet) startGateService() string {
	f.t.Helper()
	cmd := exec.Command(binary, "gate", "serve", "--config", f.cfg, "--listen", "127.0.0.1:0")
	cmd.Env = append(f.env(), "PAYGATE_GATE_TOKENS="+serviceToken)
	out, err := cmd.StderrPipe()
	if err != nil {
		f.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	url := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := regexp.MustCompile(`"url":"(http://[^"]+)"`).FindStringSubmatch(sc.Text()); m != nil {
				url <- m[1]
			}
		}
	}()
	select {
	case u := <-url:
		return u
	case <-time.After(20 * time.Second):
		f.t.Fatal("gate serve did not say where it listens")
		return ""
	}
}

// serviceCaller is a synchronous caller of a provider through the gate service, as docs/gate-service.md
// tells one to be: reserve, sleep the delay, send with the same idempotency key; woken later than half
// the margin, give the slot back and ask again.
type serviceCaller struct {
	t        *testing.T
	service  string
	provider string // its URL at the simulator
	late     time.Duration
	admitted atomic.Int64
	sent     atomic.Int64
	released atomic.Int64
}

func (c *serviceCaller) post(path, body string) map[string]any {
	req, _ := http.NewRequest("POST", c.service+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+serviceToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Error(err)
		return nil
	}
	defer resp.Body.Close()
	var v map[string]any
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || json.Unmarshal(raw, &v) != nil {
		c.t.Errorf("%s: %d %s", path, resp.StatusCode, raw)
		return nil
	}
	return v
}

// pay takes one payment through: reserve within 2 s, sleep on the slot, send.
func (c *serviceCaller) pay(id string) {
	for range 3 {
		v := c.post("/v1/providers/acme/reserve", fmt.Sprintf(`{"id":%q,"max_wait_ms":2000}`, id))
		if v == nil || v["allowed"] != true {
			return
		}
		due := time.Now().Add(time.Duration(v["delay_ms"].(float64) * float64(time.Millisecond)))
		c.admitted.Add(1)
		time.Sleep(time.Until(due))
		if time.Since(due) > c.late {
			c.released.Add(1)
			c.post("/v1/providers/acme/release", fmt.Sprintf(`{"id":%q,"slot":%q}`, id, v["slot"]))
			continue
		}
		req, _ := http.NewRequest("POST", c.provider, bytes.NewReader(fmt.Appendf(nil, `{"id":%q,"amount":1,"currency":"EUR"}`, id)))
		req.Header.Set("Idempotency-Key", id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			c.t.Error(err)
			return
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			c.post("/v1/providers/acme/pause", `{"retry_after_ms":1000}`)
		}
		c.sent.Add(1)
		return
	}
}

// The acceptance: a provider at 50/1s, two worker processes with a backlog, and at the same time a
// synchronous caller through `worker gate serve`, 30 attempts a second. The provider sees nothing over its
// limit, its budget used to ≥ 97% of what the margin allows, and the caller's payments go in their turn
// with the workers': neither starves the other.
func TestGateServiceBesideTheFleet(t *testing.T) {
	windows := []sim.Window{{Limit: 50, Per: time.Second}}
	f := newFleet(t, simProvider{name: "acme", limits: windows})
	f.established()
	service := f.startGateService()
	h2 := new(http.Protocols)
	h2.SetUnencryptedHTTP2(true)
	if resp, err := (&http.Client{Transport: &http.Transport{Protocols: h2}}).Get(service + "/healthz"); err != nil || resp.ProtoMajor != 2 {
		t.Fatalf("HTTP/2 without TLS (h2c): %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	const jobs = 300
	f.enqueue("acme", jobs, "w")
	s := f.sims["acme"]
	c := &serviceCaller{t: t, service: service, provider: s.url + "/pay", late: f.margin / 2}
	f.startWorker()
	f.startWorker()
	var wg sync.WaitGroup
	attempts := 0
	tick := time.NewTicker(time.Second / 30)
	defer tick.Stop()
	workersDone := func() bool { return s.Stats().Accepted-c.sent.Load() >= jobs }
	deadline := time.Now().Add(2 * time.Minute)
	for !workersDone() && time.Now().Before(deadline) {
		<-tick.C
		attempts++
		id := fmt.Sprintf("sync-%d", attempts)
		wg.Go(func() { c.pay(id) })
	}
	wg.Wait()
	f.waitFor("every worker job accepted", time.Minute, workersDone)
	f.stopAll()
	st := s.Stats()
	u := utilisation(st, windows, f.margin)
	t.Logf("caller: %d attempts, %d admissions, %d sent, %d given back late; provider: %d accepted (%d of the workers'), utilisation %.3f, violations %d",
		attempts, c.admitted.Load(), c.sent.Load(), c.released.Load(), st.Accepted, st.Accepted-c.sent.Load(), u, st.Violations)
	if st.Violations != 0 || u < 0.97 {
		f.dumpLogs()
		t.Fatalf("violations %d, utilisation %.3f: want 0 and ≥ 0.97", st.Violations, u)
	}
	// First come, first served: the caller's attempts are admitted within their 2 s, as the workers' are.
	if sent := c.sent.Load(); sent < int64(attempts)*9/10 || st.Accepted-sent < jobs {
		t.Fatalf("the caller sent %d of %d attempts, the workers %d of %d: one side starved", sent, attempts, st.Accepted-sent, jobs)
	}
}
