package sim_test

import (
	"errors"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/paygate/paygate/providers/sim"
)

// refuse_for stops the simulator listening: the connections it holds are closed and new ones refused
// (ECONNREFUSED, not cut), then it listens on the same address again; {} ends a refusal at once.
func TestRefuseFor(t *testing.T) {
	srv, err := sim.Start("127.0.0.1:0", sim.Options{Limits: []sim.Window{{Limit: 100, Per: time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second} // keeps its connection alive
	pay := func(key string) error {
		req, _ := http.NewRequest(http.MethodPost, srv.URL()+"/pay", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", key)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := pay("kept"); err != nil {
		t.Fatal(err)
	}
	post := func(faults string) {
		t.Helper()
		resp, err := client.Post(srv.URL()+"/faults", "application/json", strings.NewReader(faults))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("POST /faults %s: %s", faults, resp.Status)
		}
	}
	post(`{"refuse_for":"300ms"}`) // answered, on the connection it came on, which then closes
	began := time.Now()
	if err := pay("a"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("while refusing: %v, want connection refused", err)
	}
	for pay("b") != nil {
		if time.Since(began) > 5*time.Second {
			t.Fatal("still refusing 5s after a refusal of 300ms")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if since := time.Since(began); since < 300*time.Millisecond {
		t.Fatalf("listening again %s after a refusal of 300ms", since)
	}
	if err := srv.SetFaults(sim.Faults{RefuseFor: sim.Duration(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if err := pay("c"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("while refusing: %v", err)
	}
	if err := srv.SetFaults(sim.Faults{}); err != nil {
		t.Fatal(err)
	}
	if err := pay("d"); err != nil {
		t.Fatalf("after {}: %v", err)
	}
	if st := srv.Stats(); st.Accepted != 3 || st.Requests != 3 {
		t.Fatalf("stats %+v: want the 3 requests that got through, accepted", st)
	}
}
