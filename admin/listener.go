package admin

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// Listener bounds the admin listener to MaxConnections open connections,
// and keeps the probes answerable whatever holds the rest.
//
// At the cap, a new connection takes the place of the oldest idle one: a
// connection between requests, or one that sent no whole request within
// newGrace. With none idle it takes one of ProbeReserve places, which
// answer /healthz and /readyz only, within ProbeDeadline. Past those it
// is closed at once.
// Before, 64 idle connections left every probe waiting in the backlog,
// and a liveness probe restarted a healthy process.
type Listener struct {
	net.Listener
	mu     sync.Mutex
	open   map[*conn]struct{}
	probes int // of open, those in the probes' reserve
}

// ProbeReserve is how many of MaxConnections only the probes may use.
const ProbeReserve = 8

// ProbeDeadline bounds a connection in the probes' reserve, from accept
// to its last byte: a slow client cannot keep a place there.
const ProbeDeadline = 2 * time.Second

// Serve serves srv (from Server) on ln, bounded (see Listener).
func Serve(srv *http.Server, ln net.Listener) error {
	return serve(srv, newListener(ln))
}

// newListener bounds ln (see Listener).
func newListener(ln net.Listener) *Listener {
	return &Listener{Listener: ln, open: make(map[*conn]struct{}, MaxConnections)}
}

// serve serves srv on l, which it tells of each connection's state.
func serve(srv *http.Server, l *Listener) error {
	srv.ConnState, srv.ConnContext = l.track, l.context
	return srv.Serve(l)
}

// conn is one admin connection: its state as the HTTP server last told
// it, since when, and whether it holds a place of the probes' reserve.
type conn struct {
	net.Conn
	l      *Listener
	state  http.ConnState
	since  time.Time
	probe  bool
	closer sync.Once
}

// Accept returns the next connection that has a place (see Listener).
func (l *Listener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c := &conn{Conn: nc, l: l, state: http.StateNew, since: time.Now()}
		if l.place(c) {
			if c.probe {
				_ = nc.SetDeadline(c.since.Add(ProbeDeadline))
			}
			return c, nil
		}
		_ = nc.Close()
	}
}

// place finds c a place: a free one, an idle connection's (closed for
// it), or one of the probes' reserve; false when there is none.
func (l *Listener) place(c *conn) bool {
	l.mu.Lock()
	var idle *conn
	if len(l.open)-l.probes >= MaxConnections-ProbeReserve {
		now := time.Now()
		for o := range l.open {
			if o.idle(now) && (idle == nil || o.since.Before(idle.since)) {
				idle = o
			}
		}
		if idle == nil {
			if l.probes >= ProbeReserve {
				l.mu.Unlock()
				return false
			}
			c.probe = true
			l.probes++
		}
	}
	l.open[c] = struct{}{}
	l.mu.Unlock()
	if idle != nil {
		_ = idle.Close()
	}
	return true
}

// newGrace is how long a new connection may take to send its first
// request before it counts as idle: a client whose request is on its way
// keeps its place.
const newGrace = time.Second

// idle reports whether c may give its place to a new connection at now:
// between requests, or new and silent past newGrace. A reserve
// connection never does: ProbeDeadline ends it.
func (c *conn) idle(now time.Time) bool {
	return !c.probe && (c.state == http.StateIdle || c.state == http.StateNew && now.Sub(c.since) > newGrace)
}

// Close closes the connection and gives its place back, once.
func (c *conn) Close() error {
	c.closer.Do(func() {
		c.l.mu.Lock()
		if _, ok := c.l.open[c]; ok {
			delete(c.l.open, c)
			if c.probe {
				c.l.probes--
			}
		}
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}

// SetDeadline and its read and write forms keep a reserve connection
// within ProbeDeadline of its accept: the HTTP server's own deadlines
// come later.
func (c *conn) SetDeadline(t time.Time) error      { return c.Conn.SetDeadline(c.bound(t)) }
func (c *conn) SetReadDeadline(t time.Time) error  { return c.Conn.SetReadDeadline(c.bound(t)) }
func (c *conn) SetWriteDeadline(t time.Time) error { return c.Conn.SetWriteDeadline(c.bound(t)) }

func (c *conn) bound(t time.Time) time.Time {
	if end := c.since.Add(ProbeDeadline); c.probe && (t.IsZero() || t.After(end)) {
		return end
	}
	return t
}

// track is the server's ConnState hook: a connection's state, and since
// when it is idle.
func (l *Listener) track(nc net.Conn, state http.ConnState) {
	c, ok := nc.(*conn)
	if !ok {
		return
	}
	l.mu.Lock()
	// A new connection's since stays its accept: the server may start
	// serving it late. A reserve connection's since bounds it.
	if !c.probe && state != http.StateNew {
		c.since = time.Now()
	}
	c.state = state
	l.mu.Unlock()
}

// probeOnly is the request context key of a connection in the probes'
// reserve.
type probeOnly struct{}

// context marks the requests of a reserve connection (the server's
// ConnContext hook).
func (l *Listener) context(ctx context.Context, nc net.Conn) context.Context {
	if c, ok := nc.(*conn); ok && c.probe {
		return context.WithValue(ctx, probeOnly{}, true)
	}
	return ctx
}

// reserved answers anything but a probe on a reserve connection with 503:
// the other places are all busy.
func reserved(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Context().Value(probeOnly{}) != nil && r.URL.Path != "/healthz" && r.URL.Path != "/readyz" {
			w.Header().Set("Connection", "close")
			w.Header().Set("Retry-After", "1")
			http.Error(w, "every admin connection is busy; only /healthz and /readyz are answered now", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, r)
	})
}
