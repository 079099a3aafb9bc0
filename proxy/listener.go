package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sturdy/policy"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// Bounds of the backoff after an accept error that passes (as net/http's).
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// refuseWait bounds how long a refused connection is read (so the
// client's request is consumed and the 503 is not lost to a reset) and
// written.
const refuseWait = 200 * time.Millisecond

// maxRefusing bounds the connections being answered 503 at once; past
// it a connection over max_connections is closed without an answer (a
// flood must not cost a file descriptor per refusal).
const maxRefusing = 64

// acceptLogEvery bounds the accept-error log lines: one per burst, and
// no more than one per this interval while the errors go on.
const acceptLogEvery = 10 * time.Second

// Serve serves clients on ln until Shutdown: the proxy's server behind a
// listener guard (see guardedListener), and its lean twin for the
// connections opened past server.reduce_memory_above (see handoff).
func (p *Proxy) Serve(ln net.Listener) error {
	return p.serve(p.guard(ln, nil), func(l net.Listener) net.Listener { return l })
}

// ServeTLS is Serve over TLS with the PEM certificate and key files. The
// guard sits below TLS, so a refused connection is answered over TLS too.
func (p *Proxy) ServeTLS(ln net.Listener, certFile, keyFile string) error {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
	return p.serve(p.guard(ln, cfg), func(l net.Listener) net.Listener { return tls.NewListener(l, cfg) })
}

// serve runs the server on g (wrapped: TLS or not) and, unless the
// server is lean itself, the lean twin on a handoff g fills past
// server.reduce_memory_above open connections.
func (p *Proxy) serve(g *guardedListener, wrap func(net.Listener) net.Listener) error {
	if lean := p.leanServer(); lean != nil {
		h := &handoff{addr: g.Addr(), conns: make(chan net.Conn), done: make(chan struct{}), stopping: p.stopping}
		defer h.Close()
		g.lean = h
		go func() { _ = lean.Serve(wrap(h)) }()
	}
	return p.Server().Serve(wrap(g))
}

func (p *Proxy) guard(ln net.Listener, tlsConfig *tls.Config) *guardedListener {
	return &guardedListener{Listener: ln, p: p, max: int64(p.limits.MaxConnections), writeTimeout: p.limits.WriteTimeout,
		tls: tlsConfig, refusing: make(chan struct{}, maxRefusing)}
}

// guardedListener is the client listener as fasthttp sees it. An accept
// error that passes (out of file descriptors, an aborted handshake …) is
// retried with backoff instead of ending Serve; past max open connections
// a new one is answered 503 too_many_connections and closed; and every
// connection bounds each single write by writeTimeout, so a client that
// stops reading frees its upstream connection instead of pinning it. A
// connection opened while server.reduce_memory_above others are open is
// handed to lean, the lean server's listener, instead of returned (when
// lean is set).
type guardedListener struct {
	net.Listener
	p            *Proxy
	max          int64
	open         atomic.Int64
	lean         *handoff
	writeTimeout time.Duration
	tls          *tls.Config   // the listener's, to answer refusals over TLS; nil: plain
	refusing     chan struct{} // a place per refusal being written
	// failing is set in a burst of accept errors; loggedAt is when one
	// was last logged (both only touched by Accept's goroutine).
	failing  bool
	loggedAt time.Time
}

// Accept returns the next connection that may be served.
func (l *guardedListener) Accept() (net.Conn, error) {
	backoff := time.Duration(0)
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			reason, passes := acceptErrorReason(err)
			if !passes {
				return nil, err
			}
			l.p.m.AcceptErrors.WithLabelValues(reason).Inc()
			if !l.failing && time.Since(l.loggedAt) >= acceptLogEvery {
				l.loggedAt = time.Now()
				l.p.log.Warn().Str("reason", reason).Str("error", err.Error()).
					Msg("accepting connections fails; retrying with backoff (see sturdy_accept_errors_total)")
			}
			l.failing = true
			backoff = min(max(2*backoff, acceptBackoffMin), acceptBackoffMax)
			time.Sleep(backoff)
			continue
		}
		l.failing = false
		select {
		case <-l.p.stopping: // Shutdown began (before this Serve, maybe): nothing new is served
			_ = c.Close()
			return nil, net.ErrClosed
		default:
		}
		open := l.open.Add(1)
		if open > l.max {
			l.open.Add(-1)
			l.p.m.ConnectionsRefused.Inc()
			select {
			case l.refusing <- struct{}{}:
				go func() {
					l.p.refuse(c, l.tls)
					<-l.refusing
				}()
			default:
				_ = c.Close()
			}
			continue
		}
		l.p.m.ClientConnections.Inc()
		cc := &clientConn{Conn: c, l: l}
		watch(cc)
		if l.lean != nil && open > int64(l.p.limits.ReduceMemoryAbove) && l.lean.put(cc) {
			continue
		}
		return cc, nil
	}
}

// handoff is the lean server's listener: the guard puts the connections
// it accepts for that server here, and the server's Serve takes them.
// Closed, or once shutdown begins (stopping), it takes none: a lean Serve
// that began after the lean server's Shutdown serves nothing.
type handoff struct {
	addr     net.Addr
	conns    chan net.Conn
	done     chan struct{}
	stopping <-chan struct{}
	closer   sync.Once
}

// Accept returns the next connection handed off, or net.ErrClosed once
// the handoff is closed or shutdown has begun.
func (h *handoff) Accept() (net.Conn, error) {
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
// hands each connection to a worker); false once the handoff is closed
// or shutdown has begun (c is the guard's to serve).
func (h *handoff) put(c net.Conn) bool {
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
func (h *handoff) Close() error {
	h.closer.Do(func() { close(h.done) })
	return nil
}

func (h *handoff) Addr() net.Addr { return h.addr }

// acceptErrorReason names an accept error for the metric and says whether
// it passes: the listener is fine and the next accept may succeed.
func acceptErrorReason(err error) (reason string, passes bool) {
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

// refuse answers a connection over max_connections with 503 and closes
// it, after reading what the client sent so the answer is not lost to a
// reset. Over TLS it completes the handshake first.
func (p *Proxy) refuse(c net.Conn, tlsConfig *tls.Config) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * refuseWait))
	if tlsConfig != nil {
		tc := tls.Server(c, tlsConfig)
		if tc.Handshake() != nil {
			return
		}
		c = tc
	}
	_ = c.SetReadDeadline(time.Now().Add(refuseWait))
	var buf [4096]byte
	for {
		n, err := c.Read(buf[:])
		if err != nil || bytes.Contains(buf[:n], []byte("\r\n\r\n")) {
			break
		}
	}
	var resp fasthttp.Response
	e := newError(CodeTooManyConnections, p.limits.MaxConnections)
	e.retryAfter = time.Second
	e.writeTo(&resp, p.appendRequestID(nil), policy.APIOther) // before any request: no API known
	resp.SetConnectionClose()
	w := bufio.NewWriter(c)
	if resp.Write(w) == nil {
		_ = w.Flush()
	}
}

// clientConn is a client connection: each Write may block at most the
// listener's writeTimeout, closing it frees its place under
// max_connections, and when the client leaves (the watcher sees its peer
// close) the request it is serving is told.
type clientConn struct {
	net.Conn
	l      *guardedListener
	closed atomic.Bool
	// fd and watched: its place in the watcher's set (set once, at accept).
	fd      int32
	watched bool
	// mu guards ex, the exchange being served, and gone.
	mu   sync.Mutex
	ex   *exchange
	gone bool
	// deadline is the write deadline last set (UnixNano), written only by
	// the connection's writes (one at a time).
	deadline int64
	// path is the path of the last request whose first bytes a read
	// brought (pathLen of it): a request fasthttp cannot read is answered
	// in its path's API's shape (handleParseError). Read and used on the
	// connection's goroutine only.
	path    [maxNotedPath]byte
	pathLen int
}

// maxNotedPath bounds the path a clientConn notes: the API paths are
// short; a longer one is no API's.
const maxNotedPath = 64

// Read notes the path of a request whose first bytes it read: a method,
// a space, a path.
func (c *clientConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 8 && b[0] >= 'A' && b[0] <= 'Z' { // a method's first letter: a request may begin
		if sp := bytes.IndexByte(b[:8], ' '); sp >= 3 && b[sp+1] == '/' {
			p := b[sp+1 : min(n, sp+1+maxNotedPath)]
			if end := bytes.IndexAny(p, " ?#\r\n"); end >= 0 {
				p = p[:end]
			}
			c.pathLen = copy(c.path[:], p)
		}
	}
	return n, err
}

// Write bounds each write by write_timeout. The deadline is moved on
// only once a tenth of it has passed since it was last set: a write
// always has at least 90 % of write_timeout, and a connection writing
// back to back (a stream, keep-alive replies) does not re-arm the
// runtime's timer on every write.
func (c *clientConn) Write(b []byte) (int, error) {
	now := time.Now().UnixNano()
	if wt := int64(c.l.writeTimeout); now+wt-c.deadline > wt/10 {
		if err := c.Conn.SetWriteDeadline(time.Unix(0, now+wt)); err != nil {
			return 0, err
		}
		c.deadline = now + wt
	}
	return c.Conn.Write(b)
}

func (c *clientConn) Close() error {
	if !c.closed.Swap(true) {
		unwatch(c)
		c.l.open.Add(-1)
		c.l.p.m.ClientConnections.Dec()
	}
	return c.Conn.Close()
}
