package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/config"
)

// providers.<name>.breaker: on by default (5 failures, 1s, up to 5m); failures: 0 turns it off; a key
// given alone keeps the others' defaults; the environment sets each key; bad values are refused with
// their paths.
func TestBreaker(t *testing.T) {
	const provider = "providers: {acme: {url: 'http://x:1', timeout: 1s, limits: [{requests: 5, per: 1s}]%s}}"
	tests := []struct {
		name     string
		breaker  string // the provider's breaker key, as YAML
		env      map[string]string
		failures int
		openFor  time.Duration
		openMax  time.Duration
		problems []string // the problems, when the configuration is refused
	}{
		{name: "defaults", failures: 5, openFor: time.Second, openMax: 5 * time.Minute},
		{name: "off", breaker: "{failures: 0}", failures: 0, openFor: time.Second, openMax: 5 * time.Minute},
		{name: "open_for alone", breaker: "{open_for: 2s}", failures: 5, openFor: 2 * time.Second, openMax: 5 * time.Minute},
		{name: "open_for past the default open_max", breaker: "{open_for: 10m}", failures: 5, openFor: 10 * time.Minute, openMax: 10 * time.Minute},
		{name: "all three", breaker: "{failures: 3, open_for: 500ms, open_max: 30s}", failures: 3, openFor: 500 * time.Millisecond, openMax: 30 * time.Second},
		{name: "from the environment", env: map[string]string{"PAYGATE_PROVIDERS_ACME_BREAKER_FAILURES": "2", "PAYGATE_PROVIDERS_ACME_BREAKER_OPEN_MAX": "30s"},
			failures: 2, openFor: time.Second, openMax: 30 * time.Second},
		{name: "off from the environment", breaker: "{failures: 4}", env: map[string]string{"PAYGATE_PROVIDERS_ACME_BREAKER_FAILURES": "0"},
			failures: 0, openFor: time.Second, openMax: 5 * time.Minute},
		{name: "out of range", breaker: "{failures: -1}", problems: []string{"providers.acme.breaker.failures: must be 0 (off)..1000, got -1"}},
		{name: "too many", breaker: "{failures: 1001}", problems: []string{"providers.acme.breaker.failures: must be 0 (off)..1000, got 1001"}},
		{name: "open_max below open_for", breaker: "{open_for: 3s, open_max: 2s}", problems: []string{"providers.acme.breaker.open_max: must be >= open_for (3s), got 2s"}},
		{name: "open_for too short", breaker: "{open_for: 500us}", problems: []string{"providers.acme.breaker.open_for: must be >= 1ms, got 500µs"}},
		{name: "open_max too long", breaker: "{open_max: 48h}", problems: []string{"providers.acme.breaker.open_max: must be <= 24h0m0s (a provider is probed at least once a day), got 48h0m0s"}},
		{name: "a typo", breaker: "{failure: 3}", problems: []string{"providers.acme.breaker.failure: unknown key"}},
		{name: "not an integer", breaker: "{failures: 2.5}", problems: []string{"providers.acme.breaker.failures: want an integer, got 2.5"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			extra := ""
			if tt.breaker != "" {
				extra = ", breaker: " + tt.breaker
			}
			c, err := config.Load(writeFile(t, strings.Replace(provider, "%s", extra, 1)))
			if tt.problems != nil {
				if err == nil || err.Error() != "config: "+strings.Join(tt.problems, "\nconfig: ") {
					t.Fatalf("error %v, want %q", err, tt.problems)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			b := c.Providers["acme"].Breaker
			if b.Threshold() != tt.failures || b.OpenFor != tt.openFor || b.OpenMax != tt.openMax {
				t.Fatalf("breaker %d %s %s, want %d %s %s", b.Threshold(), b.OpenFor, b.OpenMax, tt.failures, tt.openFor, tt.openMax)
			}
		})
	}
}
