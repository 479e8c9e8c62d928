package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/paygate/paygate/gate"
)

func mustPolicies(t *testing.T, spec string) []gate.Policy {
	t.Helper()
	if spec == "" {
		return nil
	}
	ps, err := gate.ParsePolicies(spec)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

func TestMergeLimits(t *testing.T) {
	tests := []struct {
		name, configured, named, want string
	}{
		{"a named window replaces its limit, the others stay", "5/1s,100/1m", "3/1s", "3/1s,100/1m"},
		{"the longer window alone", "5/1s,100/1m,10000/24h", "50/1m", "5/1s,50/1m,10000/24h"},
		{"every window named", "5/1s,100/1m", "100/1m,3/1s", "3/1s,100/1m"},
		{"a window the configuration lacks is added before the longer ones", "5/1s,100/1m", "20/30s,4/1s", "4/1s,20/30s,100/1m"},
		{"between two configured windows", "5/1s,100/1m,10000/24h", "500/1h", "5/1s,100/1m,500/1h,10000/24h"},
		{"in an unsorted configuration too", "100/1m,5/1s", "20/30s,4/1s", "20/30s,100/1m,4/1s"},
		{"windows matched by length, not spelling", "5/1s,100/1m", "80/60s", "5/1s,80/1m"},
		{"raised as well as lowered", "5/1s,100/1m", "8/1s", "8/1s,100/1m"},
		{"a configured window twice: both replaced by the one named", "5/1s,8/1s,100/1m", "3/1s", "3/1s,100/1m"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := mergeLimits(mustPolicies(t, tt.configured), mustPolicies(t, tt.named))
			if s := gate.FormatPolicies(got); s != tt.want {
				t.Fatalf("mergeLimits(%s, %s) = %s, want %s", tt.configured, tt.named, s, tt.want)
			}
		})
	}
}

func TestCompareLimits(t *testing.T) {
	tests := []struct {
		name, configured, inForce      string
		kept, replaced, dropped, added string
		line                           string
	}{
		{name: "the configuration", configured: "5/1s,100/1m", inForce: "5/1s,100/1m", kept: "5/1s,100/1m", line: "kept 5/1s,100/1m"},
		{name: "one window changed", configured: "5/1s,100/1m", inForce: "3/1s,100/1m", kept: "100/1m", replaced: "5/1s",
			line: "kept 100/1m; replaced 5/1s by 3/1s"},
		{name: "replaced", configured: "5/1s,100/1m", inForce: "3/1s", replaced: "5/1s", dropped: "100/1m",
			line: "replaced 5/1s by 3/1s; dropped 100/1m"},
		{name: "added", configured: "5/1s,100/1m", inForce: "5/1s,100/1m,20/30s", kept: "5/1s,100/1m", added: "20/30s",
			line: "kept 5/1s,100/1m; added 20/30s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inForce := mustPolicies(t, tt.inForce)
			d := compareLimits(mustPolicies(t, tt.configured), inForce)
			got := []string{gate.FormatPolicies(d.kept), gate.FormatPolicies(d.replaced), gate.FormatPolicies(d.dropped), gate.FormatPolicies(d.added)}
			if want := []string{tt.kept, tt.replaced, tt.dropped, tt.added}; !slices.Equal(got, want) {
				t.Fatalf("kept, replaced, dropped, added = %q, want %q", got, want)
			}
			if line := d.line(inForce); line != tt.line {
				t.Fatalf("line %q, want %q", line, tt.line)
			}
		})
	}
}

const twoWindows = `  acme:
    url: http://127.0.0.1:8081/payments
    timeout: 10s
    limits: [{requests: 5, per: 1s}, {requests: 100, per: 1m}]
`

// limitsJSON runs "worker limits <args> --json" and decodes its report.
func limitsJSON(t *testing.T, cfg string, args ...string) limitsReport {
	t.Helper()
	r := worker(t, nil, append(append([]string{"limits"}, args...), "--config", cfg, "--provider", "acme", "--json")...)
	if r.code != 0 {
		t.Fatalf("worker limits %v: exit %d %s", args, r.code, r.stderr)
	}
	var rep limitsReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("worker limits %v: %v %s", args, err, r.stdout)
	}
	return rep
}

// checkReport compares a report's limits in force and what became of the configured ones.
func checkReport(t *testing.T, what string, rep limitsReport, limits, kept, replaced, dropped, added string) {
	t.Helper()
	got := []string{strings.Join(rep.Limits, ","), strings.Join(rep.Kept, ","), strings.Join(rep.Replaced, ","),
		strings.Join(rep.Dropped, ","), strings.Join(rep.Added, ",")}
	if want := []string{limits, kept, replaced, dropped, added}; !slices.Equal(got, want) {
		t.Fatalf("%s: limits, kept, replaced, dropped, added = %q, want %q (%+v)", what, got, want, rep)
	}
	if strings.Join(rep.Config, ",") != "5/1s,100/1m" {
		t.Fatalf("%s: config %v, want 5/1s,100/1m", what, rep.Config)
	}
}

// limits set changes the windows it names and keeps the configured others; --replace drops them.
// Every set starts from the configuration, and show marks what became of each configured limit.
func TestLimitsSetKeepsUnnamedWindows(t *testing.T) {
	cfg := testConfig(t, twoWindows)
	run := func(args ...string) result {
		return worker(t, nil, append(append([]string{"limits"}, args...), "--config", cfg, "--provider", "acme")...)
	}

	set := limitsJSON(t, cfg, "set", "--limits", "3/1s")
	checkReport(t, "set 3/1s", set, "3/1s,100/1m", "100/1m", "5/1s", "", "")
	if set.Source != gate.SourceOverride || !set.Changed || set.Version < 1 {
		t.Fatalf("set 3/1s: %+v", set)
	}
	checkReport(t, "show after set 3/1s", limitsJSON(t, cfg, "show"), "3/1s,100/1m", "100/1m", "5/1s", "", "")
	r := run("show")
	if want := "\n  kept 100/1m; replaced 5/1s by 3/1s\n"; r.code != 0 || !strings.Contains(r.stdout, want) ||
		!strings.HasPrefix(r.stdout, "provider acme: 3/1s,100/1m (override; configured 5/1s,100/1m; changed ") {
		t.Fatalf("show: exit %d, stdout %q, want %q", r.code, r.stdout, want)
	}

	replaced := limitsJSON(t, cfg, "set", "--limits", "3/1s", "--replace")
	checkReport(t, "set 3/1s --replace", replaced, "3/1s", "", "5/1s", "100/1m", "")
	if !replaced.Changed || replaced.Version != set.Version+1 {
		t.Fatalf("set 3/1s --replace: %+v after %+v", replaced, set)
	}
	checkReport(t, "show after --replace", limitsJSON(t, cfg, "show"), "3/1s", "", "5/1s", "100/1m", "")
	if r := run("show"); !strings.Contains(r.stdout, "\n  replaced 5/1s by 3/1s; dropped 100/1m\n") {
		t.Fatalf("show after --replace: %q", r.stdout)
	}

	// From the configuration, not from the live 3/1s: the 1s window is back at 5/1s.
	checkReport(t, "set 50/1m", limitsJSON(t, cfg, "set", "--limits", "50/1m"), "5/1s,50/1m", "5/1s", "100/1m", "", "")
	// A window the configuration lacks, no longer than its longest, is added.
	checkReport(t, "set 20/30s", limitsJSON(t, cfg, "set", "--limits", "20/30s"), "5/1s,20/30s,100/1m", "5/1s,100/1m", "", "", "20/30s")
	again := limitsJSON(t, cfg, "set", "--limits", "20/30s")
	if again.Changed {
		t.Fatalf("the same set again changed the limits: %+v", again)
	}
	if r := run("set", "--limits", "20/30s"); r.code != 0 || !strings.Contains(r.stdout, "): unchanged, already in force\n  kept 5/1s,100/1m; added 20/30s\n") {
		t.Fatalf("set in force already: exit %d %q", r.code, r.stdout)
	}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"set", "--limits", "10/1h"}, "longer than the configured ones (1h > 1m)"},
		{[]string{"set", "--limits", "10/1h", "--replace"}, "longer than the configured ones (1h > 1m)"},
		{[]string{"set", "--limits", "3/1s,4/1s"}, "names the window 1s twice (3/1s, 4/1s)"},
		{[]string{"set", "--limits", "3/1s,x"}, `--limits: limit "x": want N/duration`},
		{[]string{"set", "--limits", "0/1s"}, `--limits: limit "0/1s": want N/duration with N >= 1`},
		{[]string{"set"}, "limits set: --limits is required"},
		{[]string{"show", "--replace"}, "flag provided but not defined: -replace"},
	} {
		if r := run(tt.args...); r.code != 2 || !strings.Contains(r.stderr, tt.want) {
			t.Errorf("worker limits %v: exit %d, stderr %q; want 2 and %q", tt.args, r.code, r.stderr, tt.want)
		}
	}
	// Refused sets changed nothing.
	checkReport(t, "show after the refusals", limitsJSON(t, cfg, "show"), "5/1s,20/30s,100/1m", "5/1s,100/1m", "", "", "20/30s")

	reset := limitsJSON(t, cfg, "reset")
	checkReport(t, "reset", reset, "5/1s,100/1m", "5/1s,100/1m", "", "", "")
	if r := run("show"); r.stdout != "provider acme: 5/1s,100/1m (config; changed "+reset.SetAt+", version "+
		jsonInt(reset.Version)+")\n" {
		t.Fatalf("show after reset: %q", r.stdout)
	}
}

func jsonInt(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// "worker limits -h" and "worker gate -h" print their subcommands and succeed.
func TestLimitsAndGateHelp(t *testing.T) {
	for _, args := range [][]string{{"limits", "-h"}, {"limits", "--help"}, {"gate", "-h"}, {"gate", "help"}} {
		r := worker(t, nil, args...)
		if r.code != 0 || !strings.HasPrefix(r.stdout, "usage: worker "+args[0]+" <subcommand>") || r.stderr != "" {
			t.Errorf("worker %v: exit %d, stdout %q, stderr %q; want 0 and the usage", args, r.code, r.stdout, r.stderr)
		}
	}
	r := worker(t, nil, "limits", "frob")
	if r.code != 2 || !strings.Contains(r.stderr, `limits: unknown subcommand "frob"`) {
		t.Errorf("worker limits frob: exit %d, stderr %q", r.code, r.stderr)
	}
}
