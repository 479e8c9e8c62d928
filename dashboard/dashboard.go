// Package dashboard serves `worker dashboard`: one live page of every provider's budget, read from Redis
// (through the gate) by this process, not by a worker. It samples every provider once a second, whether
// one page is open or fifty, keeps the last samples for the charts, and answers the pages (which poll the
// latest sample) and any server-sent event stream from them. The page and its script are embedded: no
// framework, no CDN, offline.
package dashboard

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/report"
)

//go:embed page
var page embed.FS

// Source reads every provider's status, in the order the page shows them. A provider that cannot be read
// (Redis down, say) is reported in its entry's error.
type Source func(ctx context.Context) []Entry

// EventMinutes is how many minutes of 429s and dead letters an entry carries.
const EventMinutes = 10

// GateSource reads the named providers through l, as gate status --json prints them (report.Of), with
// their 429s and dead letters of the last EventMinutes minutes (gate.Limiter.EventsSince).
func GateSource(l *gate.Limiter, names []string) Source {
	return func(ctx context.Context) []Entry {
		out := make([]Entry, 0, len(names))
		for _, name := range names {
			rep, err := report.Of(ctx, l, name)
			e := Entry{Status: rep}
			if err != nil {
				e = Entry{Status: report.Status{Provider: name}, Error: err.Error()}
				out = append(out, e)
				continue
			}
			minutes, err := l.EventsSince(ctx, name, time.Now().Add(-(EventMinutes-1)*time.Minute))
			if err != nil {
				e.Error = err.Error()
			}
			for _, m := range minutes {
				em := Minute{At: m.Minute.UTC(), Throttled: m.Counts[gate.EventThrottled]}
				for k, n := range m.Counts {
					if reason, ok := strings.CutPrefix(k, gate.EventDead); ok {
						if em.Dead == nil {
							em.Dead = map[string]int64{}
						}
						em.Dead[reason] = n
					}
				}
				e.Events = append(e.Events, em)
			}
			out = append(out, e)
		}
		return out
	}
}

// Backlog reads how many jobs wait in the broker, by provider name (RabbitMQ: the ready messages of its
// queue; Kafka: the consumer group's lag on its topic), and by <provider>.high and <provider>.low for its
// high and low jobs' queues or topics (the priority classes). A provider left out is unknown.
type Backlog func(ctx context.Context) (map[string]int64, error)

// WithBacklog is src with each entry's Queued read from b, every class together, and QueuedByClass (an
// error is the entry's, once per sample).
func WithBacklog(src Source, b Backlog) Source {
	return func(ctx context.Context) []Entry {
		out := src(ctx)
		queued, err := b(ctx)
		for i := range out {
			if err != nil {
				out[i].BacklogError = err.Error()
				continue
			}
			p := out[i].Provider
			var total int64
			known := false
			for _, class := range []string{"high", "normal", "low"} {
				key := p
				if class != "normal" {
					key = p + "." + class
				}
				n, ok := queued[key]
				if !ok {
					continue
				}
				total, known = total+n, true
				if out[i].QueuedByClass == nil {
					out[i].QueuedByClass = map[string]int64{}
				}
				out[i].QueuedByClass[class] = n
			}
			if known {
				out[i].Queued = &total
			}
		}
		return out
	}
}

// Entry is one provider in a sample: its status, or why it could not be read.
type Entry struct {
	report.Status
	Error string `json:"error,omitempty"`
	// Queued is how many jobs wait in the broker (Backlog); nil when unknown, and BacklogError says why.
	Queued       *int64 `json:"queued,omitempty"`
	BacklogError string `json:"backlog_error,omitempty"`
	// QueuedByClass is Queued by priority class (high, normal, low), for the classes the Backlog read.
	QueuedByClass map[string]int64 `json:"queued_by_class,omitempty"`
	// Events are the provider's 429s and dead letters, counted per minute by every worker, the last
	// EventMinutes minutes, oldest first.
	Events []Minute `json:"events,omitempty"`
}

// Minute is one minute of a provider's events: 429s, and dead letters by reason.
type Minute struct {
	At        time.Time        `json:"at"`
	Throttled int64            `json:"throttled"`
	Dead      map[string]int64 `json:"dead,omitempty"`
}

// Sample is what the page receives every second: the time it was read (this host's clock) and every
// provider's entry.
type Sample struct {
	At        time.Time `json:"at"`
	Providers []Entry   `json:"providers"`
}

// Server samples a Source and serves the page, the latest sample, the kept history and a stream of samples.
type Server struct {
	src   Source
	every time.Duration
	keep  int

	mu      sync.Mutex
	history []Sample // oldest first, at most keep
	subs    map[chan []byte]struct{}

	samples atomic.Int64 // samples read (each reads every provider once)
}

// New returns a server that reads src every `every`, keeping the last `keep` samples (the charts' span).
func New(src Source, every time.Duration, keep int) *Server {
	return &Server{src: src, every: every, keep: keep, subs: map[chan []byte]struct{}{}}
}

// Samples is how many samples the server has read: its cost on Redis is that times the providers' reads.
func (s *Server) Samples() int64 { return s.samples.Load() }

// Run samples until ctx ends.
func (s *Server) Run(ctx context.Context) {
	t := time.NewTicker(s.every)
	defer t.Stop()
	for {
		s.sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Server) sample(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, s.every)
	smp := Sample{At: time.Now().UTC(), Providers: s.src(rctx)}
	cancel()
	s.samples.Add(1)
	msg, err := json.Marshal(smp)
	if err != nil {
		return
	}
	s.mu.Lock()
	s.history = append(s.history, smp)
	if len(s.history) > s.keep {
		s.history = append(s.history[:0:0], s.history[len(s.history)-s.keep:]...)
	}
	for c := range s.subs {
		select {
		case c <- msg:
		default: // a page that does not keep up misses a sample, never blocks the others
		}
	}
	s.mu.Unlock()
}

// Handler serves:
//
//	/             the page (index.html, app.js)
//	/api/status   the latest sample (JSON)
//	/api/history  the kept samples, oldest first (JSON)
//	/api/events   a server-sent event per sample (data: the sample's JSON)
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(page, "page")
	mux.Handle("GET /", http.FileServerFS(static))
	mux.HandleFunc("GET /api/status", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		var last any = Sample{}
		if n := len(s.history); n > 0 {
			last = s.history[n-1]
		}
		s.mu.Unlock()
		writeJSON(w, last)
	})
	mux.HandleFunc("GET /api/history", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		h := append([]Sample{}, s.history...)
		s.mu.Unlock()
		writeJSON(w, h)
	})
	mux.HandleFunc("GET /api/events", s.events)
	return mux
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	c := make(chan []byte, 4)
	s.mu.Lock()
	s.subs[c] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.subs, c)
		s.mu.Unlock()
	}()
	fmt.Fprint(w, ": paygate dashboard\n\n")
	flusher.Flush()
	for {
		select {
		case <-r.Context().Done():
			return
		case msg := <-c:
			if _, err := fmt.Fprintf(w, "data: %s\n\n", msg); err != nil {
				return
			}
			flusher.Flush()
		}
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-cache")
	_ = json.NewEncoder(w).Encode(v)
}
