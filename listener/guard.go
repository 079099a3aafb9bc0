// Package listener is the client listener: what happens to a client's
// connection before and after the proxy serves requests on it. It
// never imports the proxy; the proxy gives it what it needs (Config).
//
//	guard.go            Guard: accept errors (retried with backoff), max_connections (past it a 503, written
//	                    by the proxy's Refusal), the lean server's Handoff past reduce_memory_above
//	conn.go             Conn: each write bounded by write_timeout, the path a request began with (NotedPath)
//	leave.go            the request a Conn serves told, once, when its client leaves (Serving, a Leaver)
//	watch_linux.go, watch_other.go   the watcher that sees clients leave (one epoll set on Linux)
//	fdlimit_unix.go, fdlimit_other.go   the file descriptor limit behind max_connections' default
//
// Who decides what: the Guard decides whether a connection is served,
// refused or handed to the lean server; the watcher decides that a
// client left; the proxy decides what a refusal says and what a
// request does once its client left (its Leaver).
package listener

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Bounds of the backoff after an accept error that passes (as net/http's).
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// RefuseWait bounds how long a refused connection is read, so the
// client's request is consumed and the 503 is not lost to a reset.
const RefuseWait = 200 * time.Millisecond

// MaxRefusing bounds the connections answered 503 at once. Past it a
// connection over max_connections is closed without an answer: a flood
// must not cost a file descriptor per refusal.
const MaxRefusing = 64

// acceptLogEvery bounds the accept-error log lines: one per burst, and
// no more than one per this interval while the errors go on.
const acceptLogEvery = 10 * time.Second

// Config is what a Guard is told by the proxy: its bounds, and whom it
// tells what happened.
type Config struct {
	// MaxConnections is server.max_connections: more open are refused.
	MaxConnections int64
	// ReduceMemoryAbove is server.reduce_memory_above: past it a new
	// connection goes to the Handoff, when there is one.
	ReduceMemoryAbove int64
	// WriteTimeout bounds each single write to a client.
	WriteTimeout time.Duration
	// TLS is the listener's TLS config, to answer refusals over TLS; nil: plain.
	TLS *tls.Config
	// Stopping is closed when shutdown begins: nothing new is served.
	Stopping <-chan struct{}
	// Refusal writes the answer to a connection over MaxConnections.
	Refusal func(c net.Conn)
	// AcceptError counts an accept error that passes; log is true when
	// it should be logged too (one line per burst, at most every 10 s).
	AcceptError func(reason string, err error, log bool)
	// Opened, Closed and Refused count client connections.
	Opened, Closed, Refused func()
}

// Guard is the client listener as fasthttp sees it. An accept error
// that passes is retried with backoff instead of ending Serve. Past
// MaxConnections a new connection is refused and closed. Every
// connection bounds each write by WriteTimeout, so a client that stops
// reading frees its upstream connection instead of pinning it. Past
// ReduceMemoryAbove open connections a new one goes to the lean server.
type Guard struct {
	net.Listener
	cfg      Config
	open     atomic.Int64
	lean     *Handoff
	refusing chan struct{} // a place per refusal being written
	// failing is set in a burst of accept errors; loggedAt is when one
	// was last logged (both only touched by Accept's goroutine).
	failing  bool
	loggedAt time.Time
}

// New guards ln; lean, when not nil, takes the connections opened past
// cfg.ReduceMemoryAbove.
func New(ln net.Listener, cfg Config, lean *Handoff) *Guard {
	return &Guard{Listener: ln, cfg: cfg, lean: lean, refusing: make(chan struct{}, MaxRefusing)}
}

// Accept returns the next connection that may be served.
func (l *Guard) Accept() (net.Conn, error) {
	backoff := time.Duration(0)
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			reason, passes := AcceptErrorReason(err)
			if !passes {
				return nil, err
			}
			logIt := !l.failing && time.Since(l.loggedAt) >= acceptLogEvery
			if logIt {
				l.loggedAt = time.Now()
			}
			l.cfg.AcceptError(reason, err, logIt)
			l.failing = true
			backoff = min(max(2*backoff, acceptBackoffMin), acceptBackoffMax)
			time.Sleep(backoff)
			continue
		}
		l.failing = false
		select {
		case <-l.cfg.Stopping: // shutdown began (before this Serve, maybe): nothing new is served
			_ = c.Close()
			return nil, net.ErrClosed
		default:
		}
		open := l.open.Add(1)
		if open > l.cfg.MaxConnections {
			l.open.Add(-1)
			l.cfg.Refused()
			select {
			case l.refusing <- struct{}{}:
				go func() {
					l.refuse(c)
					<-l.refusing
				}()
			default:
				_ = c.Close()
			}
			continue
		}
		l.cfg.Opened()
		cc := &Conn{Conn: c, l: l}
		watch(cc)
		if l.lean != nil && open > l.cfg.ReduceMemoryAbove && l.lean.put(cc) {
			continue
		}
		return cc, nil
	}
}

// refuse answers a connection over MaxConnections (cfg.Refusal) and
// closes it, after reading what the client sent so the answer is not
// lost to a reset. Over TLS it completes the handshake first.
func (l *Guard) refuse(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * RefuseWait))
	if l.cfg.TLS != nil {
		tc := tls.Server(c, l.cfg.TLS)
		if tc.Handshake() != nil {
			return
		}
		c = tc
	}
	_ = c.SetReadDeadline(time.Now().Add(RefuseWait))
	var buf [4096]byte
	for {
		n, err := c.Read(buf[:])
		if err != nil || bytes.Contains(buf[:n], []byte("\r\n\r\n")) {
			break
		}
	}
	l.cfg.Refusal(c)
}

// Handoff is the lean server's listener: the Guard puts the connections
// it accepts for that server here, and the server's Serve takes them.
// Closed, or once shutdown begins (stopping), it takes none: a lean Serve
// that began after the lean server's Shutdown serves nothing.
type Handoff struct {
	addr     net.Addr
	conns    chan net.Conn
	done     chan struct{}
	stopping <-chan struct{}
	closer   sync.Once
}

// NewHandoff is a Handoff answering to addr, ending when stopping closes.
func NewHandoff(addr net.Addr, stopping <-chan struct{}) *Handoff {
	return &Handoff{addr: addr, conns: make(chan net.Conn), done: make(chan struct{}), stopping: stopping}
}

// Accept returns the next connection handed off, or net.ErrClosed once
// the handoff is closed or shutdown has begun.
func (h *Handoff) Accept() (net.Conn, error) {
	select {
	case <-h.done:
		return nil, net.ErrClosed
	case <-h.stopping:
		return nil, net.ErrClosed
	case c := <-h.conns:
		return c, nil
	}
}

// put hands c to the lean server, waiting while its accept loop is
// behind (the guard's accept loop waits with it: the lean one only
// hands each connection to a worker). It is false once the handoff is
// closed or shutdown has begun: c is then the guard's to serve.
func (h *Handoff) put(c net.Conn) bool {
	select {
	case <-h.done:
		return false
	case <-h.stopping:
		return false
	case h.conns <- c:
		return true
	}
}

// Close ends Accept.
func (h *Handoff) Close() error {
	h.closer.Do(func() { close(h.done) })
	return nil
}

// Addr is the address the Handoff answers to: the Guard's.
func (h *Handoff) Addr() net.Addr { return h.addr }

// AcceptErrorReason names an accept error for the metric and says whether
// it passes: the listener is fine and the next accept may succeed.
func AcceptErrorReason(err error) (reason string, passes bool) {
	switch {
	case errors.Is(err, syscall.EMFILE):
		return "emfile", true
	case errors.Is(err, syscall.ENFILE):
		return "enfile", true
	case errors.Is(err, syscall.ECONNABORTED):
		return "econnaborted", true
	case errors.Is(err, syscall.ENOBUFS), errors.Is(err, syscall.ENOMEM):
		return "enobufs", true
	case errors.Is(err, syscall.EINTR), errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EPROTO),
		errors.Is(err, syscall.EPERM):
		return "other", true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "other", true
	}
	return "", false
}
