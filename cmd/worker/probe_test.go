package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// worker probe: exit 0 on a 2xx answer; 1 on another, naming the URL and the answer's first line, or
// when nothing answers; 2 for a URL that is not http(s).
func TestProbe(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			fmt.Fprintln(w, "ok")
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "broker: rabbitmq consume connection down\nmore")
	}))
	defer srv.Close()
	if r := worker(t, nil, "probe", "--url", srv.URL+"/readyz"); r.code != 0 || !strings.Contains(r.stdout, "200 ok") {
		t.Errorf("a ready worker: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := worker(t, nil, "probe", "--url", srv.URL+"/down"); r.code != 1 || !strings.Contains(r.stderr, srv.URL+"/down answered 503: broker: rabbitmq consume connection down") {
		t.Errorf("a worker not ready: exit %d %q", r.code, r.stderr)
	}
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	if r := worker(t, nil, "probe", "--url", closed.URL+"/readyz", "--timeout", "1s"); r.code != 1 || !strings.Contains(r.stderr, closed.URL) {
		t.Errorf("nothing listening: exit %d %q", r.code, r.stderr)
	}
	if r := worker(t, nil, "probe", "--url", "ftp://x/readyz"); r.code != 2 || !strings.Contains(r.stderr, "want an http:// or https:// URL") {
		t.Errorf("a URL that is not http: exit %d %q", r.code, r.stderr)
	}
}
