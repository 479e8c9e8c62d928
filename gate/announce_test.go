package gate_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/gate"
)

// Every shape of announcement is written as its script publishes it, and read back to the same value.
func TestAnnouncementShapes(t *testing.T) {
	until, lost, at := time.UnixMicro(1764081234567890), time.UnixMicro(1764081234000001), time.UnixMicro(1764081299000000)
	tests := []struct {
		name string
		a    gate.Announcement
		wire string
	}{
		{"pause", gate.Announcement{Kind: gate.AnnouncePause, Provider: "acme", Until: until}, "acme 1764081234567890"},
		{"loss", gate.Announcement{Kind: gate.AnnounceLoss, Provider: "acme", Until: until, Lost: lost}, "acme 1764081234567890 1764081234000001"},
		{"limits", gate.Announcement{Kind: gate.AnnounceLimits, Provider: "acme", At: at}, "acme limits 1764081299000000"},
		{"landed", gate.Announcement{Kind: gate.AnnounceLanded, Provider: "acme"}, "acme landed"},
		{"cancel", gate.Announcement{Kind: gate.AnnounceCancel, Provider: "acme", ID: "pay 42/x"}, "acme cancel pay 42/x"},
		{"provider with digits, dash and underscore", gate.Announcement{Kind: gate.AnnouncePause, Provider: "psp_2-eu", Until: until}, "psp_2-eu 1764081234567890"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.a.String(); got != tt.wire {
				t.Errorf("String() = %q, want %q", got, tt.wire)
			}
			got, err := gate.ParseAnnouncement(tt.wire)
			if err != nil {
				t.Fatalf("ParseAnnouncement(%q): %v", tt.wire, err)
			}
			if !sameAnnouncement(got, tt.a) {
				t.Errorf("ParseAnnouncement(%q) = %+v, want %+v", tt.wire, got, tt.a)
			}
			if again := got.String(); again != tt.wire {
				t.Errorf("round trip: %q became %q", tt.wire, again)
			}
		})
	}
}

// A message of none of the four shapes is refused, with an error that quotes it and says what is wrong.
func TestParseAnnouncementRefuses(t *testing.T) {
	tests := []struct {
		name, msg, why string
	}{
		{"empty", "", "want a provider and at least one more field"},
		{"provider alone", "acme", "want a provider and at least one more field"},
		{"a word in place of a time", "acme soon", `time "soon"`},
		{"a zero time", "acme 0", `time "0"`},
		{"a negative time", "acme -5", `time "-5"`},
		{"a fraction", "acme 1.5e15", `time "1.5e15"`},
		{"a warm-up's lost time a word", "acme 1764081234567890 later", `time "later"`},
		{"three times", "acme 1 2 3", "a pause has one time and a warm-up two"},
		{"limits without a time", "acme limits", `want "<provider> limits <at_us>"`},
		{"limits with two times", "acme limits 1 2", `want "<provider> limits <at_us>"`},
		{"limits at a word", "acme limits now", `time "now"`},
		{"limits at zero", "acme limits 0", `time "0"`},
		{"landed with more", "acme landed 5", `"<provider> landed" has no more fields`},
		{"cancel without an id", "acme cancel", `want "<provider> cancel <id>"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := gate.ParseAnnouncement(tt.msg)
			if err == nil {
				t.Fatalf("ParseAnnouncement(%q) = %+v, want an error", tt.msg, a)
			}
			for _, want := range []string{"gate: announcement", strings.TrimSpace(tt.msg), tt.why} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}
}

// What the scripts publish (pause.lua, lua/family's warm-up, limits.lua, land.lua) is read by
// ParseAnnouncement as the announcement of its kind, and written back by String as published.
func TestScriptsPublishAnnouncements(t *testing.T) {
	rdb := backends(t)[0].rdb
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	prefix := uniquePrefix(t)
	l, err := gate.New(rdb, gate.Options{Prefix: prefix, WarmUp: true, Providers: map[string]gate.Provider{
		prov: {Policies: []gate.Policy{pol(10, 50*time.Millisecond)}, MaxInFlight: 1, Lease: 100 * time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	ps := rdb.Subscribe(ctx, prefix+":pauses")
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	heard := func(kind gate.AnnouncementKind) gate.Announcement {
		t.Helper()
		msg, err := ps.ReceiveMessage(ctx)
		if err != nil {
			t.Fatalf("waiting for a %s announcement: %v", kind, err)
		}
		a, err := gate.ParseAnnouncement(msg.Payload)
		if err != nil {
			t.Fatal(err)
		}
		if a.Kind != kind || a.Provider != prov || a.String() != msg.Payload {
			t.Fatalf("%q read as %+v (written back as %q), want a %s announcement of %s", msg.Payload, a, a.String(), kind, prov)
		}
		return a
	}

	v, err := l.Reserve(ctx, prov, "first", 1, time.Second) // the first decision warms up (for a lease: 100ms)
	if err != nil || !v.Allowed {
		t.Fatalf("%+v %v", v, err)
	}
	if a := heard(gate.AnnounceLoss); a.Lost.IsZero() || !a.Until.After(a.Lost) {
		t.Errorf("warm-up %+v: want a pause ending after the loss", a)
	}
	if err := l.Land(ctx, prov, v.Lease); err != nil { // the cap of 1 was full
		t.Fatal(err)
	}
	heard(gate.AnnounceLanded)
	if err := l.Pause(ctx, prov, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if a := heard(gate.AnnouncePause); a.Until.IsZero() {
		t.Errorf("pause %+v without its end", a)
	}
	if _, err := l.SetLimits(ctx, prov, []gate.Policy{pol(5, 50*time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	if a := heard(gate.AnnounceLimits); a.At.IsZero() {
		t.Errorf("limits %+v without their moment", a)
	}
}

func sameAnnouncement(a, b gate.Announcement) bool {
	return a.Kind == b.Kind && a.Provider == b.Provider && a.Until.Equal(b.Until) && a.Lost.Equal(b.Lost) && a.At.Equal(b.At) && a.ID == b.ID
}
