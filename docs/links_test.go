package docs

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// The files whose links are checked, relative to this directory: the README, the benchmark report and
// every page here.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) == 0 {
		t.Fatal("no docs/*.md pages found")
	}
	return append([]string{"../README.md", "../BENCHMARKS.md"}, pages...)
}

var (
	fence      = regexp.MustCompile("^\\s*(```|~~~)")
	heading    = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	codeSpan   = regexp.MustCompile("`+[^`]*`+")
	// [text](target) or [text](target "title"); images (![alt](src)) match too.
	link       = regexp.MustCompile(`\[[^\[\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	inlineLink = regexp.MustCompile(`\[([^\[\]]*)\]\([^)]*\)`)
)

// lines returns the file's lines outside fenced code blocks, with their line numbers.
func lines(text string) (out []string, numbers []int) {
	in := false
	for i, l := range strings.Split(text, "\n") {
		if fence.MatchString(l) {
			in = !in
			continue
		}
		if !in {
			out = append(out, l)
			numbers = append(numbers, i+1)
		}
	}
	return out, numbers
}

// slug is GitHub's anchor for a heading: the heading's text (links reduced to their text, code spans
// to their content), lower case, every character but letters, digits, spaces, '-' and '_' dropped,
// spaces turned into '-'.
func slug(h string) string {
	h = inlineLink.ReplaceAllString(h, "$1")
	h = strings.ToLower(h)
	var b strings.Builder
	for _, r := range h {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns every anchor a markdown text defines: one per heading (a repeated slug gets -1, -2,
// … as on GitHub) and one per <a id="…"> or <a name="…">.
func anchors(text string) map[string]bool {
	set := map[string]bool{}
	seen := map[string]int{}
	ls, _ := lines(text)
	for _, l := range ls {
		for _, m := range htmlAnchor.FindAllStringSubmatch(l, -1) {
			set[m[1]] = true
		}
		m := heading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		s := slug(m[2])
		if n, ok := seen[s]; ok {
			seen[s] = n + 1
			s = fmt.Sprintf("%s-%d", s, n+1)
		} else {
			seen[s] = 0
		}
		set[s] = true
	}
	return set
}

// brokenLinks lists every relative link in the markdown file that does not resolve: a missing file, or
// an anchor no heading of the target .md file produces.
func brokenLinks(file string) ([]string, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var broken []string
	cache := map[string]map[string]bool{}
	targetAnchors := func(path string) (map[string]bool, error) {
		if a, ok := cache[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		cache[path] = anchors(string(b))
		return cache[path], nil
	}
	ls, numbers := lines(string(raw))
	for i, l := range ls {
		l = codeSpan.ReplaceAllStringFunc(l, func(s string) string { return strings.Trim(s, "`") })
		for _, m := range link.FindAllStringSubmatch(l, -1) {
			target := m[1]
			lower := strings.ToLower(target)
			if strings.HasPrefix(lower, "http://") || strings.HasPrefix(lower, "https://") || strings.HasPrefix(lower, "mailto:") {
				continue
			}
			where := fmt.Sprintf("%s:%d: %s", file, numbers[i], target)
			path, anchor, _ := strings.Cut(target, "#")
			path, err := url.PathUnescape(path)
			if err != nil {
				broken = append(broken, where+": "+err.Error())
				continue
			}
			resolved := file
			if path != "" {
				resolved = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
				if _, err := os.Stat(resolved); err != nil {
					broken = append(broken, where+": no such file")
					continue
				}
			}
			if anchor == "" || !strings.EqualFold(filepath.Ext(resolved), ".md") {
				continue
			}
			a, err := targetAnchors(resolved)
			if err != nil {
				broken = append(broken, where+": "+err.Error())
				continue
			}
			if !a[anchor] {
				broken = append(broken, where+": no heading makes the anchor #"+anchor)
			}
		}
	}
	return broken, nil
}

func TestLinks(t *testing.T) {
	for _, f := range markdownFiles(t) {
		broken, err := brokenLinks(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range broken {
			t.Error(b)
		}
	}
}

func TestREADMEIsShort(t *testing.T) {
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	n := strings.Count(string(raw), "\n")
	if !strings.HasSuffix(string(raw), "\n") {
		n++
	}
	if n > 200 {
		t.Errorf("README.md has %d lines, want at most 200: move the detail to docs/", n)
	}
}

func TestNoTrailingSpaces(t *testing.T) {
	files, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range append([]string{"../README.md"}, files...) {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range strings.Split(string(raw), "\n") {
			if strings.TrimRight(l, " \t") != l {
				t.Errorf("%s:%d: trailing whitespace", f, i+1)
			}
		}
	}
}

func TestSlug(t *testing.T) {
	for h, want := range map[string]string{
		"The job contract":                  "the-job-contract",
		"Kafka without a broker: cmd/kfake": "kafka-without-a-broker-cmdkfake",
		"What each guarantees, and how it reserves, remembers and gives back": "what-each-guarantees-and-how-it-reserves-remembers-and-gives-back",
		"`worker gate status`":               "worker-gate-status",
		"[The gate](gate.md) and Redis_keys": "the-gate-and-redis_keys",
		"Duration, exit status and flags":    "duration-exit-status-and-flags",
		"Ünïcode – dash":                     "ünïcode--dash",
	} {
		if got := slug(h); got != want {
			t.Errorf("slug(%q) = %q, want %q", h, got, want)
		}
	}
	a := anchors("# Notes\n\n## Notes\n\n```\n# not a heading\n```\n\n## Notes\n<a id=\"custom\"></a>\n")
	for _, want := range []string{"notes", "notes-1", "notes-2", "custom"} {
		if !a[want] {
			t.Errorf("anchors: missing %q in %v", want, a)
		}
	}
	if a["not-a-heading"] {
		t.Error("anchors: a line in a code block was taken for a heading")
	}
}
