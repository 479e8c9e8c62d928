package sim

import (
	"errors"
	"net"
	"net/http"
	"sync"
	"time"
)

// refusing is the simulator's TCP listener, which can stop listening for a while (Faults.RefuseFor), as
// a provider whose process is down: its socket is closed, so that new connections are refused by the
// kernel (ECONNREFUSED), and so are the connections it holds, each as soon as it is idle (a request on
// its way, the POST /faults that began the refusal among them, is answered first); then it listens on the
// same address again. http.Server's Accept loop waits meanwhile; its ConnState hook is connState.
type refusing struct {
	addr net.Addr

	mu     sync.Mutex
	ln     net.Listener // nil while refusing
	resume *time.Timer  // ends the refusal
	back   chan struct{}
	closed bool
	idle   map[net.Conn]struct{} // the server's connections between requests
}

func newRefusing(ln net.Listener) *refusing {
	return &refusing{addr: ln.Addr(), ln: ln, back: make(chan struct{}), idle: map[net.Conn]struct{}{}}
}

var errListenerClosed = errors.New("sim: listener closed")

// Accept waits for a connection, through refusals.
func (r *refusing) Accept() (net.Conn, error) {
	for {
		r.mu.Lock()
		ln, back, closed := r.ln, r.back, r.closed
		r.mu.Unlock()
		switch {
		case closed:
			return nil, errListenerClosed
		case ln == nil:
			<-back
			continue
		}
		c, err := ln.Accept()
		if err == nil {
			return c, nil
		}
		r.mu.Lock()
		refusedMeanwhile := r.ln != ln && !r.closed
		r.mu.Unlock()
		if !refusedMeanwhile {
			return nil, err
		}
	}
}

// connState follows the server's connections (http.Server.ConnState): while refusing, one that is idle
// is closed.
func (r *refusing) connState(c net.Conn, st http.ConnState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case st != http.StateNew && st != http.StateIdle:
		delete(r.idle, c)
	case r.ln == nil && !r.closed:
		delete(r.idle, c)
		_ = c.Close()
	default:
		r.idle[c] = struct{}{}
	}
}

// refuse stops listening for d (0: listens again now, ending a refusal).
func (r *refusing) refuse(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	if r.resume != nil {
		r.resume.Stop()
		r.resume = nil
	}
	if d <= 0 {
		r.listenLocked()
		return
	}
	if r.ln != nil {
		_ = r.ln.Close()
		r.ln = nil
	}
	for c := range r.idle { // the process is down: its connections go with it
		_ = c.Close()
		delete(r.idle, c)
	}
	r.resume = time.AfterFunc(d, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.listenLocked()
	})
}

// listenLocked listens on the address again, if it is not listening (retrying while the port is still
// held, as after a close), and wakes Accept. Under the lock.
func (r *refusing) listenLocked() {
	if r.closed || r.ln != nil {
		return
	}
	ln, err := net.Listen(r.addr.Network(), r.addr.String())
	if err != nil {
		r.resume = time.AfterFunc(50*time.Millisecond, func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.listenLocked()
		})
		return
	}
	r.ln = ln
	close(r.back)
	r.back = make(chan struct{})
}

// Close stops listening for good.
func (r *refusing) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	if r.resume != nil {
		r.resume.Stop()
	}
	close(r.back)
	if r.ln != nil {
		return r.ln.Close()
	}
	return nil
}

// Addr is the address it listens on, refusing or not.
func (r *refusing) Addr() net.Addr { return r.addr }
