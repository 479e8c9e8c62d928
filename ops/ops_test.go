package ops_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/ops"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestEndpoints(t *testing.T) {
	reg := prometheus.NewRegistry()
	consumers.NewMetrics(reg).Touch("acme")
	brokerDown := errors.New("rabbitmq consume connection down")
	var brokerErr error
	srv, err := ops.Start("127.0.0.1:0", reg, map[string]ops.Check{
		"redis":  func(context.Context) error { return nil },
		"broker": func(context.Context) error { return brokerErr },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	base := "http://" + srv.Addr()
	if code, body := get(t, base+"/healthz"); code != 200 || !strings.Contains(body, "ok") {
		t.Fatalf("healthz %d %q", code, body)
	}
	if code, _ := get(t, base+"/readyz"); code != 200 {
		t.Fatalf("readyz %d with every check passing", code)
	}
	brokerErr = brokerDown
	if code, body := get(t, base+"/readyz"); code != 503 || !strings.Contains(body, "broker: rabbitmq consume connection down") {
		t.Fatalf("readyz %d %q with the broker down", code, body)
	}
	code, body := get(t, base+"/metrics")
	for _, name := range []string{"paygate_jobs_total", "paygate_gate_wait_seconds", "paygate_gate_decisions_total",
		"paygate_dispatch_duration_seconds", "paygate_inflight", "paygate_dispatch_lateness_seconds"} {
		if code != 200 || !strings.Contains(body, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}
