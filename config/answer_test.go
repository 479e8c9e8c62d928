package config_test

import (
	"testing"

	"github.com/paygate/paygate/config"
)

// What a result keeps of an answer, and declined_when: the defaults, and each setting that cannot work
// refused with its path.
func TestAnswerSettings(t *testing.T) {
	const base = "providers: {acme: {url: 'http://127.0.0.1:8081/payments', timeout: 1s, limits: [{requests: 1, per: 1s}]"
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{"the defaults", "", nil},
		{"declines by status and by a field", ", declined_when: {statuses: [402], json: {field: result.status, values: [declined, failed]}}", nil},
		{"a response_max too large", ", response_max: 2000000", []string{"providers.acme.response_max: must be 0..1048576 bytes, got 2000000"}},
		{"a header that is no header", ", result_headers: ['Request Id']", []string{`providers.acme.result_headers: must be HTTP header names, got "Request Id"`}},
		{"declined_when empty", ", declined_when: {}", []string{"providers.acme.declined_when: needs statuses, json or both"}},
		{"a 429 or a 500 as a decline", ", declined_when: {statuses: [429, 500]}", []string{
			"providers.acme.declined_when.statuses: must be 2xx or 4xx statuses other than 429, got 429",
			"providers.acme.declined_when.statuses: must be 2xx or 4xx statuses other than 429, got 500"}},
		{"a field that is no path, without values", ", declined_when: {json: {field: 'a..b'}}", []string{
			`providers.acme.declined_when.json.field: must be a dot path into the answer's JSON (status, or data.state), got "a..b"`,
			"providers.acme.declined_when.json.values: must list the values that mean declined"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := config.Load(writeFile(t, base+tt.yaml+"}}\n"))
			wantProblems(t, err, tt.want)
			if tt.want == nil {
				p := c.Providers["acme"]
				if p.ResponseMax != 64<<10 || len(p.ResultHeaders) != 3 || p.ResultHeaders[0] != "Location" {
					t.Fatalf("response_max %d, result_headers %v: want 65536 and Location, Request-Id, X-Request-Id", p.ResponseMax, p.ResultHeaders)
				}
			}
		})
	}
}
