package providers

import (
	"context"
	"net"
	"sync"
	"time"
)

// spareDialer keeps a few freshly dialed connections to the provider ready, so that a dispatch that needs
// a new connection (at start, after an idle spell, when the pool grows) does not pay a dial at its slot:
// a dial lands the request late, where it can meet the next window's requests sent on time. Spares older
// than maxAge are replaced; a spare the server closed meanwhile fails its first write, and net/http
// retries the request on a new connection (requests with an Idempotency-Key count as idempotent).
type spareDialer struct {
	dial   func(ctx context.Context, network, addr string) (net.Conn, error)
	want   int
	maxAge time.Duration

	mu     sync.Mutex
	spares map[string][]spare // by network+addr
	busy   map[string]int     // dials in progress
	closed bool
}

type spare struct {
	conn net.Conn
	at   time.Time
}

func newSpareDialer(d *net.Dialer, want int, maxAge time.Duration) *spareDialer {
	return &spareDialer{dial: d.DialContext, want: want, maxAge: maxAge, spares: map[string][]spare{}, busy: map[string]int{}}
}

// DialContext hands out a fresh spare when there is one, and tops the spares up in the background.
func (s *spareDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	key := network + " " + addr
	s.mu.Lock()
	var conn net.Conn
	for list := s.spares[key]; len(list) > 0 && conn == nil; list = s.spares[key] {
		sp := list[len(list)-1]
		s.spares[key] = list[:len(list)-1]
		if time.Since(sp.at) < s.maxAge && alive(sp.conn) {
			conn = sp.conn
		} else {
			_ = sp.conn.Close()
		}
	}
	s.refillLocked(network, addr)
	s.mu.Unlock()
	if conn != nil {
		return conn, nil
	}
	return s.dial(ctx, network, addr)
}

func (s *spareDialer) refillLocked(network, addr string) {
	key := network + " " + addr
	for n := len(s.spares[key]) + s.busy[key]; n < s.want && !s.closed; n++ {
		s.busy[key]++
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			conn, err := s.dial(ctx, network, addr)
			cancel()
			s.mu.Lock()
			defer s.mu.Unlock()
			s.busy[key]--
			switch {
			case err != nil:
			case s.closed:
				_ = conn.Close()
			default:
				s.spares[key] = append(s.spares[key], spare{conn, time.Now()})
			}
		}()
	}
}

// Warm starts dialing spares to addr before the first request needs them.
func (s *spareDialer) Warm(network, addr string) {
	s.mu.Lock()
	s.refillLocked(network, addr)
	s.mu.Unlock()
}

// Close closes the spares.
func (s *spareDialer) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for k, list := range s.spares {
		for _, sp := range list {
			_ = sp.conn.Close()
		}
		delete(s.spares, k)
	}
}
