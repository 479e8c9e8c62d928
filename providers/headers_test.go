package providers_test

import (
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/providers"
	"github.com/paygate/paygate/providers/sim"
)

func TestParseLimitHeaders(t *testing.T) {
	for _, tt := range []struct {
		name    string
		headers map[string]string
		want    []providers.Announced
	}{
		{"IETF draft 07+", map[string]string{"RateLimit-Policy": `"burst";q=100;w=1, "daily";q=5000;w=86400`, "RateLimit": `"burst";r=40;t=1`},
			[]providers.Announced{{100, time.Second}, {5000, 24 * time.Hour}}},
		{"earlier drafts", map[string]string{"RateLimit-Limit": "60", "RateLimit-Policy": "60;w=1", "RateLimit-Remaining": "3"},
			[]providers.Announced{{60, time.Second}}},
		{"earlier drafts, limit alone", map[string]string{"RateLimit-Limit": "60, 60;w=1"}, []providers.Announced{{60, 0}}},
		{"X-RateLimit", map[string]string{"X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "4999", "X-RateLimit-Reset": "1372700873"},
			[]providers.Announced{{5000, 0}}},
		{"malformed items skipped", map[string]string{"RateLimit-Policy": `"a";q=x;w=1, "b";q=10;w=0, "c";q=7;w=2`},
			[]providers.Announced{{7, 2 * time.Second}}},
		{"nothing", map[string]string{"Content-Type": "application/json"}, nil},
		{"garbage", map[string]string{"X-RateLimit-Limit": "lots"}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tt.headers {
				h.Set(k, v)
			}
			if got := providers.ParseLimitHeaders(h); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// What provider-sim announces (--headers) is what ParseLimitHeaders reads.
func TestSimAnnouncesWhatIsParsed(t *testing.T) {
	for _, tt := range []struct {
		headers string
		want    []providers.Announced
	}{
		{sim.HeadersIETF, []providers.Announced{{60, time.Second}, {1000, time.Minute}}},
		{sim.HeadersXRateLimit, []providers.Announced{{60, 0}}},
		{sim.HeadersNone, nil},
	} {
		s, err := sim.Start("127.0.0.1:0", sim.Options{Limits: []sim.Window{{Limit: 60, Per: time.Second}, {Limit: 1000, Per: time.Minute}}, Headers: tt.headers})
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodPost, s.URL()+"/pay", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "k-"+tt.headers)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		_ = s.Close()
		if got := providers.ParseLimitHeaders(resp.Header); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("--headers %s: parsed %v, want %v (headers %v)", tt.headers, got, tt.want, resp.Header)
		}
	}
}
