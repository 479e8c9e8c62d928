package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/dashboard"
	"github.com/paygate/paygate/internal/report"
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
