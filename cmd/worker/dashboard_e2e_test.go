package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/dashboard"
	"github.com/paygate/paygate/internal/report"
	"github.com/paygate/paygate/providers/sim"
)

// worker dashboard, through the binary: every configured provider is on the page's data, with the used and
// limit figures worker gate status --json prints, and the page is served.
func TestDashboardCLI(t *testing.T) {
	cfg := testConfig(t, fivePer3s+`  beta:
    url: http://127.0.0.1:8081/payments
    timeout: 10s
    limits: [{requests: 7, per: 1h}]
`)
	for range 3 {
		if r := worker(t, nil, "gate", "try", "--config", cfg, "--provider", "beta"); r.code != 0 {
			t.Fatalf("gate try: %d %s", r.code, r.stderr)
		}
	}
	addr := startListening(t, exec.Command(binary, "dashboard", "--config", cfg, "--listen", "127.0.0.1:0"))
	var last dashboard.Sample
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get("http://" + addr + "/api/status")
		if err != nil {
			t.Fatal(err)
		}
		err = json.NewDecoder(resp.Body).Decode(&last)
		resp.Body.Close()
		if err == nil && len(last.Providers) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no sample of both providers within 10s: %+v (%v)", last, err)
		}
	}
	for _, e := range last.Providers {
		r := worker(t, nil, "gate", "status", "--config", cfg, "--provider", e.Provider, "--json")
		var want report.Status
		if err := json.Unmarshal([]byte(r.stdout), &want); r.code != 0 || err != nil {
			t.Fatalf("gate status %s: %d %v %s", e.Provider, r.code, err, r.stderr)
		}
		if e.Error != "" || len(e.Policies) != len(want.Policies) {
			t.Fatalf("%s on the dashboard: %+v; gate status: %+v", e.Provider, e, want)
		}
		for i, p := range e.Policies {
			if w := want.Policies[i]; p.Limit != w.Limit || p.Used != w.Used {
				t.Errorf("%s policy %d: dashboard %d of %s, gate status %d of %s", e.Provider, i, p.Used, p.Limit, w.Used, w.Limit)
			}
		}
	}
	if beta := last.Providers[1]; beta.Provider != "beta" || beta.Policies[0].Used != 3 || beta.Policies[0].Limit != "7/1h" {
		t.Fatalf("beta on the dashboard: %+v; want 3 of 7/1h used", beta)
	}

	// The page as a browser renders it: headless Chromium (scripts/services.sh installs it) runs its script
	// and prints the DOM; every provider is there with gate status's figures.
	dom := chromium(t, "--dump-dom", "http://"+addr+"/")
	for _, e := range last.Providers {
		if !strings.Contains(dom, `data-provider="`+e.Provider+`"`) {
			t.Fatalf("the page shows no %s:\n%s", e.Provider, dom)
		}
	}
	row := regexp.MustCompile(`data-provider="beta".*?<tr data-policy="0"><td class="limit">([^<]*)</td><td class="used">(\d+)</td>`).FindStringSubmatch(dom)
	if row == nil || row[1] != "7/1h" || row[2] != "3" {
		t.Fatalf("beta's first limit on the page: %q; want 3 of 7/1h used\n%s", row, dom)
	}
	shot := filepath.Join(t.TempDir(), "dashboard.png")
	chromium(t, "--window-size=1200,700", "--screenshot="+shot, "http://"+addr+"/")
	if st, err := os.Stat(shot); err != nil || st.Size() < 1000 {
		t.Fatalf("no screenshot: %v", err)
	}
	t.Logf("screenshot: %s", shot)
}

// chromium runs headless Chromium with args and returns its stdout; the page's script gets 3 s of virtual
// time first.
func chromium(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium not found (scripts/services.sh up installs it): %v", err)
	}
	cmd := exec.Command(bin, append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--hide-scrollbars", "--virtual-time-budget=3000", "--user-data-dir=" + t.TempDir()}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, errb.String())
	}
	return out.String()
}

// limitOf is the number of units in a limit as gate status prints it ("20/1s": 20).
func limitOf(spec string) int64 {
	n, _ := strconv.ParseInt(strings.SplitN(spec, "/", 2)[0], 10, 64)
	return n
}

// pageRows reads each provider's policies off the dumped page: provider -> [limit, used] per policy.
func pageRows(t *testing.T, dom string) map[string][][2]string {
	t.Helper()
	out := map[string][][2]string{}
	for _, card := range regexp.MustCompile(`(?s)<article class="provider" data-provider="([^"]+)">(.*?)</article>`).FindAllStringSubmatch(dom, -1) {
		for _, row := range regexp.MustCompile(`<tr data-policy="\d+"><td class="limit">([^<]*)</td><td class="used">(\d+)</td>`).FindAllStringSubmatch(card[2], -1) {
			out[card[1]] = append(out[card[1]], [2]string{row[1], row[2]})
		}
	}
	return out
}

// statusJSON is worker gate status --json for each provider.
func statusJSON(t *testing.T, f *fleet, providers ...string) map[string]report.Status {
	t.Helper()
	out := map[string]report.Status{}
	for _, p := range providers {
		r := worker(t, f.env2, "gate", "status", "--config", f.cfg, "--provider", p, "--json")
		var st report.Status
		if err := json.Unmarshal([]byte(r.stdout), &st); r.code != 0 || err != nil {
			t.Fatalf("gate status %s: %d %v %s", p, r.code, err, r.stderr)
		}
		out[p] = st
	}
	return out
}

// worker dashboard beside a running fleet (two worker processes, two providers with a backlog), as headless
// Chromium renders it: every provider is on the page, each limit as gate status --json prints it, and each
// used figure within a second of gate status's (the page's figure lies between what gate status said a
// second before the page was read and what it said after). Once the fleet stops, the page and gate status
// agree exactly. The jobs waiting in RabbitMQ are on the page too.
func TestDashboardWithAFleet(t *testing.T) {
	f := newFleet(t,
		simProvider{name: "acme", limits: []sim.Window{{Limit: 20, Per: time.Second}, {Limit: 2000, Per: time.Minute}}},
		simProvider{name: "beta", limits: []sim.Window{{Limit: 5, Per: time.Second}}})
	f.established()
	f.enqueue("acme", 400, "a")
	f.enqueue("beta", 100, "b")
	f.startWorker()
	f.startWorker()
	f.waitAccepted("acme", 40, time.Minute)
	cmd := exec.Command(binary, "dashboard", "--config", f.cfg, "--listen", "127.0.0.1:0")
	cmd.Env = f.env()
	addr := startListening(t, cmd)
	time.Sleep(1500 * time.Millisecond) // a sample or two

	before := statusJSON(t, f, "acme", "beta")
	dom := chromium(t, "--dump-dom", "http://"+addr+"/")
	after := statusJSON(t, f, "acme", "beta")
	rows := pageRows(t, dom)
	for _, p := range []string{"acme", "beta"} {
		if len(rows[p]) != len(before[p].Policies) {
			t.Fatalf("%s on the page: %v; gate status: %+v\n%s", p, rows[p], before[p], dom)
		}
		for i, row := range rows[p] {
			b, a := before[p].Policies[i], after[p].Policies[i]
			used, _ := strconv.ParseInt(row[1], 10, 64)
			if row[0] != b.Limit || used < 0 || used > limitOf(b.Limit) {
				t.Errorf("%s policy %d on the page: %s of %s; gate status says %s", p, i, row[1], row[0], b.Limit)
			}
			// The minute's use only grows during the run: the page's lies within a second (20 units, the
			// fastest it grows) of gate status's before the page was read, and at most its after.
			perSecond := int64(20)
			if p == "acme" && i == 1 && (used < b.Used-perSecond || used > a.Used) {
				t.Errorf("acme's 2000/1m on the page: %d used; gate status %d before and %d after (want the page within a second, %d units, of them)",
					used, b.Used, a.Used, perSecond)
			}
		}
	}
	queued := regexp.MustCompile(`data-provider="acme".*?<span class="queued">(\d+)</span>`).FindStringSubmatch(dom)
	if queued == nil {
		t.Fatalf("acme's queue depth is not on the page:\n%s", dom)
	}
	if n, _ := strconv.Atoi(queued[1]); n > 400 {
		t.Errorf("acme's queue depth on the page: %d, more than the 400 enqueued", n)
	}
	shot := filepath.Join(os.TempDir(), "paygate-dashboard-fleet.png") // kept: docs/img/dashboard.png is one
	chromium(t, "--window-size=1200,640", "--screenshot="+shot, "http://"+addr+"/")
	if st, err := os.Stat(shot); err != nil || st.Size() < 1000 {
		t.Fatalf("no screenshot: %v", err)
	}
	t.Logf("screenshot of the page beside the fleet: %s", shot)

	// Stopped, past max_inline_wait (the last reservations' slots) and a 1s window: nothing moves any more.
	f.stopAll()
	time.Sleep(3 * time.Second)
	still := statusJSON(t, f, "acme", "beta")
	rows = pageRows(t, chromium(t, "--dump-dom", "http://"+addr+"/"))
	for _, p := range []string{"acme", "beta"} {
		for i, row := range rows[p] {
			if w := still[p].Policies[i]; row[0] != w.Limit || row[1] != strconv.FormatInt(w.Used, 10) {
				t.Errorf("%s policy %d, the fleet stopped: page %s of %s, gate status %d of %s", p, i, row[1], row[0], w.Used, w.Limit)
			}
		}
	}
}

// Fifty providers on one page: every one of them rendered, with both its limits; the browser's time to
// render a sample is logged (docs/operations.md quotes it).
func TestDashboardFiftyProviders(t *testing.T) {
	var providers strings.Builder
	for i := range 50 {
		fmt.Fprintf(&providers, "  p%02d:\n    url: http://127.0.0.1:8081/payments\n    timeout: 10s\n    limits: [{requests: 10, per: 1s}, {requests: 500, per: 1h}]\n", i)
	}
	cfg := testConfig(t, providers.String())
	addr := startListening(t, exec.Command(binary, "dashboard", "--config", cfg, "--listen", "127.0.0.1:0"))
	time.Sleep(1500 * time.Millisecond)
	dom := chromium(t, "--dump-dom", "http://"+addr+"/")
	rows := pageRows(t, dom)
	for i := range 50 {
		if p := fmt.Sprintf("p%02d", i); len(rows[p]) != 2 || rows[p][0][0] != "10/1s" || rows[p][1][0] != "500/1h" {
			t.Fatalf("%s on the page: %v", p, rows[p])
		}
	}
	if m := regexp.MustCompile(`data-render-ms="([0-9.]+)"`).FindStringSubmatch(dom); m != nil {
		t.Logf("a sample of 50 providers rendered in %s ms", m[1])
	} else {
		t.Errorf("the page did not record its render time:\n%.2000s", dom)
	}
}
