package job

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"testing"
	"unicode/utf8"
)

// sameFields checks that members reads a valid body exactly as encoding/json's decoder does: the same
// members, each value's bytes the same, or the same error.
func sameFields(t *testing.T, body []byte) {
	t.Helper()
	got, gotErr := members(body)
	if v := bytes.TrimSpace(body); v[0] != '{' {
		// Not an object: refused as such, whatever it holds (the decoder reads a top-level number as a
		// float64 first, and refuses one too large for it as "not JSON").
		want := fmt.Sprintf("body must be a JSON object, got %s", excerpt(v))
		if got != nil || fmt.Sprint(gotErr) != want {
			t.Fatalf("%q: members %q, %v; want %s", body, got, gotErr, want)
		}
		return
	}
	want, wantErr := decodeFields(body)
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
		t.Fatalf("%q: members error %v, the decoder's %v", body, gotErr, wantErr)
	}
	if !maps.EqualFunc(got, want, func(a, b json.RawMessage) bool { return string(a) == string(b) }) {
		t.Fatalf("%q: members %q, the decoder's %q", body, got, want)
	}
	for k, raw := range got {
		if raw[0] != '"' {
			continue
		}
		var want string
		wantErr := json.Unmarshal(raw, &want)
		if s, err := unquote(raw); s != want || (err == nil) != (wantErr == nil) {
			t.Fatalf("%q: %s's text %q (%v), encoding/json's %q (%v)", body, k, s, err, want, wantErr)
		}
	}
}

func TestMembersAsDecoded(t *testing.T) {
	for _, body := range []string{
		`{}`, ` { } `, "\t{\n}\r\n",
		`{"id":"pay-1","provider":"acme","amount":1250,"currency":"EUR"}`,
		` { "id" : "a" , "amount" : -12 , "cost":3 } `,
		"{\"id\":\n\"a\",\t\"amount\"\r:\n7\n}",
		`{"i\u0064":"a","pro\"vider":"x","\\":1}`,
		`{"payload":{"a":"}]\"{[","b":[1,{"c":null}],"d":"\\"},"id":"x"}`,
		`{"a":[],"b":{},"c":[[[]]],"d":true,"e":false,"f":null,"g":-1.5e-3,"h":""}`,
		`{"id":"a","id":"b"}`, `{"id":"a","i\u0064":"b"}`, `{"a":{"id":1},"id":2}`,
		`[1,2]`, ` "a" `, `12`, `null`, ` true`, `[]`,
		`{"é":"ü","x":"\u00e9\ud83d\ude00"}`,
	} {
		if !json.Valid([]byte(body)) {
			t.Fatalf("not valid JSON: %q", body)
		}
		sameFields(t, []byte(body))
	}
}

// FuzzMembers: on any valid body, members and the decoder agree.
func FuzzMembers(f *testing.F) {
	for _, seed := range []string{
		`{"id":"pay-1","provider":"acme","amount":1250,"currency":"EUR"}`,
		`{"a":{"b":"}\"{","c":[1,{"d":null}]},"\u0061":1}`, ` {"x" : [ ] } `, `"a"`,
		`{"payload":{"a":["\\\"}]",{"b":"\\\\"}]}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !utf8.Valid(body) || !json.Valid(body) {
			return // Decode refuses those first, or through the decoder
		}
		sameFields(t, body)
	})
}
