package lua

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// scripts are the family's scripts, by algorithm, with the helper parts each one is to have.
var scripts = []struct {
	name, src string
	counters  bool // family/counters.lua
	undo      bool // family/undo.lua
	arrivals  bool // family/arrivals.lua
}{
	{"sliding_log", SlidingLog, false, false, false},
	{"sliding_window", SlidingWindow, true, false, false},
	{"token_bucket", TokenBucket, false, true, false},
	{"gcra", GCRA, false, true, true},
	{"fixed_window", FixedWindow, true, false, false},
	{"leaky_bucket", LeakyBucket, false, true, true},
}

// Each script is the driver's parts in order, the helpers its algorithm uses and no other, then its own
// file.
func TestFamilyParts(t *testing.T) {
	driver := familyContract + familyWrites + familyState + familyRecord + familyOps
	for _, s := range scripts {
		t.Run(s.name, func(t *testing.T) {
			if !strings.HasPrefix(s.src, driver) {
				t.Fatal("does not begin with the driver's parts, in order")
			}
			for _, h := range []struct {
				part string
				want bool
			}{{familyCounters, s.counters}, {familyUndo, s.undo}, {familyArrivals, s.arrivals}} {
				first := strings.SplitN(h.part, "\n", 2)[0]
				if got := strings.Contains(s.src, h.part); got != h.want {
					t.Errorf("has %q: %v, want %v", first, got, h.want)
				}
			}
			if !strings.HasSuffix(s.src, "\n") {
				t.Error("does not end with a newline: the line the gate appends would join its last line")
			}
		})
	}
}

var (
	luacFunction = regexp.MustCompile(`^(?:main|function) <[^>]*:(\d+),\d+>`)
	luacCounts   = regexp.MustCompile(`(\d+) upvalues?, (\d+) locals?`)
	luacGlobal   = regexp.MustCompile(`\t(?:GET|SET)GLOBAL\t.*; (\S+)$`)
)

// Each script compiles under Lua 5.1 (the Lua of Redis), whose limits a function must fit: at most 60
// upvalues and 200 locals (luac5.1 refuses more). The parts share file-level locals, so a part that used
// a local declared in a later part would read a global instead: no function reads or writes a global but
// Redis's (redis, and KEYS, ARGV under EVALSHA) and _G, where the globals are bound. Skipped where luac5.1
// is not installed (apt-get install lua5.1).
func TestLua51Limits(t *testing.T) {
	luac, err := exec.LookPath("luac5.1")
	if err != nil {
		t.Skip("luac5.1 is not installed")
	}
	allowed := map[string]bool{"redis": true, "KEYS": true, "ARGV": true, "_G": true}
	for _, s := range scripts {
		t.Run(s.name, func(t *testing.T) {
			// As the gate runs it under EVALSHA (gate/algorithm.go's newFamily).
			src := s.src + "\nreturn paygate(eval_args())\n"
			cmd := exec.Command(luac, "-p", "-l", "-l", "-")
			cmd.Stdin = strings.NewReader(src)
			var out, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("luac5.1: %v: %s", err, stderr.String())
			}
			most, at, line := 0, 0, 0
			sc := bufio.NewScanner(&out)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				l := sc.Text()
				if m := luacFunction.FindStringSubmatch(l); m != nil {
					line, _ = strconv.Atoi(m[1])
				}
				if m := luacCounts.FindStringSubmatch(l); m != nil {
					if n, _ := strconv.Atoi(m[1]); n > most {
						most, at = n, line
					}
				}
				if m := luacGlobal.FindStringSubmatch(l); m != nil && !allowed[m[1]] {
					t.Errorf("a function reads or writes the global %s: %s", m[1], strings.TrimSpace(l))
				}
			}
			if err := sc.Err(); err != nil {
				t.Fatal(err)
			}
			if most > 60 {
				t.Errorf("a function has %d upvalues (Lua 5.1 allows 60)", most)
			}
			t.Logf("at most %d upvalues in a function (the one at line %d)", most, at)
		})
	}
}

// TestLuaProfile runs each script's reserves in plain Lua 5.1 with Redis stubbed (testdata/profile.lua)
// and logs what its own Lua does per job, one reserve a call and 32 a call: VM instructions and calls of
// C functions, and the functions that take most. A tool, not a check: it runs only with
// PAYGATE_LUA_PROFILE set (1, or an algorithm's name) and lua5.1 installed.
func TestLuaProfile(t *testing.T) {
	want := os.Getenv("PAYGATE_LUA_PROFILE")
	if want == "" {
		t.Skip("PAYGATE_LUA_PROFILE is not set")
	}
	lua, err := exec.LookPath("lua5.1")
	if err != nil {
		t.Skip("lua5.1 is not installed")
	}
	for _, s := range scripts {
		if want != "1" && want != s.name {
			continue
		}
		t.Run(s.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), s.name+".lua")
			if err := os.WriteFile(path, []byte(s.src), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, jobs := range []string{"0", "32"} {
				out, err := exec.Command(lua, "testdata/profile.lua", path, jobs).CombinedOutput()
				if err != nil {
					t.Fatalf("lua5.1: %v: %s", err, out)
				}
				t.Logf("jobs a call %s (0: one reserve, not op batch):\n%s", jobs, out)
			}
		})
	}
}
