package sim_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/providers/sim"
)

// reject_for answers every payment 422 (or reject_status) without charging it; once it ends, the same
// idempotency key is charged. A rejection of 429 is refused.
func TestRejectFor(t *testing.T) {
	srv, err := sim.Start("127.0.0.1:0", sim.Options{Limits: []sim.Window{{Limit: 100, Per: time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	pay := func(key string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL()+"/pay", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if err := srv.SetFaults(sim.Faults{RejectFor: sim.Duration(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if got := pay("a"); got != http.StatusUnprocessableEntity {
		t.Fatalf("while rejecting: %d, want 422", got)
	}
	if err := srv.SetFaults(sim.Faults{RejectFor: sim.Duration(time.Hour), RejectCode: 403}); err != nil {
		t.Fatal(err)
	}
	if got := pay("a"); got != http.StatusForbidden {
		t.Fatalf("while rejecting with 403: %d", got)
	}
	if err := srv.SetFaults(sim.Faults{RejectFor: sim.Duration(time.Hour), RejectCode: 429}); err == nil {
		t.Fatal("a rejection with 429 was taken")
	}
	if err := srv.SetFaults(sim.Faults{}); err != nil {
		t.Fatal(err)
	}
	if got := pay("a"); got != http.StatusOK {
		t.Fatalf("after the rejections: %d, want 200", got)
	}
	if st := srv.Stats(); st.RejectedInjected != 2 || st.Accepted != 1 || st.Requests != 3 || st.Duplicates != 0 {
		t.Fatalf("stats %+v: want 2 rejected, then the key charged once", st)
	}
}
