package gateapi_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/paygate/paygate/gateapi"
)

// docs/gate-api.yaml documents every route the API serves, with its method, and no other.
func TestOpenAPIDocument(t *testing.T) {
	raw, err := os.ReadFile("../docs/gate-api.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	var documented []string
	for path, methods := range doc.Paths {
		if !strings.HasPrefix(path, "/v1/") {
			continue
		}
		for m := range methods {
			documented = append(documented, strings.ToUpper(m)+" "+path)
		}
	}
	served := slices.Clone(gateapi.Routes)
	slices.Sort(served)
	slices.Sort(documented)
	if !slices.Equal(served, documented) {
		t.Fatalf("served:\n%s\ndocumented:\n%s", strings.Join(served, "\n"), strings.Join(documented, "\n"))
	}
}
