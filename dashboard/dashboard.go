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

// GateSource reads the named providers through l, as gate status --json prints them (report.Of).
func GateSource(l *gate.Limiter, names []string) Source {
	return func(ctx context.Context) []Entry {
		out := make([]Entry, 0, len(names))
		for _, name := range names {
			rep, err := report.Of(ctx, l, name)
			e := Entry{Status: rep}
			if err != nil {
				e = Entry{Status: report.Status{Provider: name}, Error: err.Error()}
			}
			out = append(out, e)
		}
		return out
	}
}

// Entry is one provider in a sample: its status, or why it could not be read.
type Entry struct {
	report.Status
	Error string `json:"error,omitempty"`
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
