package gate

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Announcement is one message on a gate's announcement channel (<prefix>:pauses), which Watch hears. Six
// scripts publish them, each one shape; times are µs since the Unix epoch on the Redis clock, > 0:
//
//	AnnouncePause   "<provider> <until_us>"            pause.lua: a pause until Until
//	AnnounceLoss    "<provider> <until_us> <lost_us>"  lua/family: the state was found lost at Lost and the
//	                                                   warm-up pauses the provider until Until
//	AnnounceLimits  "<provider> limits <at_us>"        limits.lua: the live limits changed at At
//	AnnounceLanded  "<provider> landed"                land.lua: an in-flight lease ended with the cap full
//	AnnounceBreaker "<provider> breaker <phase> <seq> <failures> <until_us> <hold_us> <now_us>"
//	                                                   breaker.lua: the breaker changed (Breaker; its
//	                                                   until and hold are 0 when none)
//	AnnounceCancel  "<provider> cancel <id>"           cancel.lua: a job admitted for a slot still ahead
//	                                                   was cancelled (ID: the rest of the message)
//
// A provider's name has no spaces (job.ValidProvider) and comes first; the second field is a time or one
// of the words, so the shapes cannot be mistaken for one another.
type Announcement struct {
	Kind     AnnouncementKind
	Provider string
	// Until is the end of the pause (AnnouncePause, AnnounceLoss); Lost when the loss was found
	// (AnnounceLoss); At when the live limits changed (AnnounceLimits). The others are zero.
	Until, Lost, At time.Time
	// Breaker is the breaker's new state (AnnounceBreaker: its Phase, Seq, Failures, Until, Hold and Now).
	Breaker BreakerState
	// ID is the cancelled job's id (AnnounceCancel).
	ID string
}

// AnnouncementKind tells the announcements apart.
type AnnouncementKind int

// The kinds of Announcement, one per script that publishes.
const (
	AnnouncePause AnnouncementKind = iota + 1
	AnnounceLoss
	AnnounceLimits
	AnnounceLanded
	AnnounceBreaker
	AnnounceCancel
)

// The words that name a shape in place of its first time.
const (
	wordLimits  = "limits"
	wordLanded  = "landed"
	wordBreaker = "breaker"
	wordCancel  = "cancel"
)

func (k AnnouncementKind) String() string {
	switch k {
	case AnnouncePause:
		return "pause"
	case AnnounceLoss:
		return "loss"
	case AnnounceLimits:
		return wordLimits
	case AnnounceLanded:
		return wordLanded
	case AnnounceBreaker:
		return wordBreaker
	case AnnounceCancel:
		return wordCancel
	}
	return "AnnouncementKind(" + strconv.Itoa(int(k)) + ")"
}

// String writes the announcement as its script publishes it.
func (a Announcement) String() string {
	us := func(t time.Time) string { return strconv.FormatInt(t.UnixMicro(), 10) }
	switch a.Kind {
	case AnnouncePause:
		return a.Provider + " " + us(a.Until)
	case AnnounceLoss:
		return a.Provider + " " + us(a.Until) + " " + us(a.Lost)
	case AnnounceLimits:
		return a.Provider + " " + wordLimits + " " + us(a.At)
	case AnnounceLanded:
		return a.Provider + " " + wordLanded
	case AnnounceCancel:
		return a.Provider + " " + wordCancel + " " + a.ID
	case AnnounceBreaker:
		b, n := a.Breaker, func(v int64) string { return strconv.FormatInt(v, 10) }
		zus := func(t time.Time) string {
			if t.IsZero() {
				return "0"
			}
			return us(t)
		}
		return a.Provider + " " + wordBreaker + " " + b.Phase.String() + " " + n(b.Seq) + " " + n(b.Failures) + " " +
			zus(b.Until) + " " + zus(b.Hold) + " " + us(b.Now)
	}
	return a.Provider + " " + a.Kind.String()
}

// ParseAnnouncement reads a message of the announcement channel (fields separated by white space; a
// cancel's id is the rest of the message); a message of none of the shapes is an error.
func ParseAnnouncement(msg string) (Announcement, error) {
	fields := strings.Fields(msg)
	bad := func(why string) (Announcement, error) {
		return Announcement{}, fmt.Errorf("gate: announcement %q: %s", msg, why)
	}
	if len(fields) < 2 {
		return bad("want a provider and at least one more field")
	}
	a := Announcement{Provider: fields[0]}
	switch {
	case fields[1] == wordCancel:
		// The id is the rest of the message as published (it may hold spaces).
		_, id, _ := strings.Cut(strings.TrimLeft(msg, " \t"), " "+wordCancel+" ")
		if len(fields) < 3 || checkID(id) != nil {
			return bad(`want "<provider> cancel <id>"`)
		}
		a.Kind, a.ID = AnnounceCancel, id
		return a, nil
	case fields[1] == wordBreaker:
		return parseBreaker(a, fields, bad)
	case fields[1] == wordLanded:
		if len(fields) != 2 {
			return bad(`"<provider> landed" has no more fields`)
		}
		a.Kind = AnnounceLanded
		return a, nil
	case fields[1] == wordLimits:
		if len(fields) != 3 {
			return bad(`want "<provider> limits <at_us>"`)
		}
		a.Kind = AnnounceLimits
		var err error
		if a.At, err = announcedTime(fields[2]); err != nil {
			return bad(err.Error())
		}
		return a, nil
	case len(fields) > 3:
		return bad("a pause has one time and a warm-up two")
	}
	until, err := announcedTime(fields[1])
	if err != nil {
		return bad(err.Error())
	}
	a.Kind, a.Until = AnnouncePause, until
	if len(fields) == 3 {
		if a.Lost, err = announcedTime(fields[2]); err != nil {
			return bad(err.Error())
		}
		a.Kind = AnnounceLoss
	}
	return a, nil
}

// announcedTime reads a time of an announcement: µs since the Unix epoch, > 0.
func announcedTime(field string) (time.Time, error) {
	us, err := strconv.ParseInt(field, 10, 64)
	if err != nil || us <= 0 {
		return time.Time{}, fmt.Errorf("time %q: want µs since the Unix epoch, > 0", field)
	}
	return time.UnixMicro(us), nil
}

// parseBreaker reads "<provider> breaker <phase> <seq> <failures> <until_us> <hold_us> <now_us>" (fields),
// whose until and hold are 0 when none.
func parseBreaker(a Announcement, fields []string, bad func(string) (Announcement, error)) (Announcement, error) {
	const shape = `want "<provider> breaker <phase> <seq> <failures> <until_us> <hold_us> <now_us>"`
	if len(fields) != 8 {
		return bad(shape)
	}
	phase, ok := breakerPhaseOf(fields[2])
	if !ok {
		return bad("unknown breaker phase " + strconv.Quote(fields[2]))
	}
	var n [5]int64
	for i := range n {
		v, err := strconv.ParseInt(fields[3+i], 10, 64)
		if err != nil || v < 0 {
			return bad(shape + ", whole numbers >= 0")
		}
		n[i] = v
	}
	now, err := announcedTime(fields[7])
	if err != nil {
		return bad(err.Error())
	}
	a.Kind, a.At = AnnounceBreaker, now
	a.Breaker = BreakerState{Phase: phase, Seq: n[0], Failures: n[1], Until: usTime(n[2]), Hold: usTime(n[3]), Now: now}
	return a, nil
}
