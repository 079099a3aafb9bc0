package upstream

import (
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// maxIdleConnDuration keeps pooled upstream connections below the idle
// timeouts of common model servers (vLLM closes after 5 s), so Sturdy
// rarely sends a request on a connection the server is closing.
const maxIdleConnDuration = 4 * time.Second

// ReadBuffer also caps the size of an upstream's response headers:
// hosted APIs send many.
const ReadBuffer = 64 << 10

// dial opens a connection within the connect timeout, TLS handshake
// included, and wraps it so reads of a streamed body are bounded by the
// idle timeout instead of one deadline for the whole stream.
//
// The dial runs on a goroutine of its own, waited for: the net package's
// (address resolution, a resolver's frames of up to 2 KiB each) and a TLS
// handshake's on the request's goroutine would grow its stack past 8 KiB
// to 16 KiB, kept for as long as the client's connection lives — every
// open stream and idle keep-alive connection that once dialed. A dial is
// a handshake; the goroutine costs a microsecond of it.
func (ep *Endpoint) dial(addr string) (net.Conn, error) {
	claimant := ep.takeClaim() // before the dial: others need not wait for it
	type dialed struct {
		c   net.Conn
		err error
	}
	done := make(chan dialed, 1)
	go func() {
		c, err := ep.dialNow(addr, claimant)
		done <- dialed{c, err}
	}()
	r := <-done
	return r.c, r.err
}

// dialNow is dial's work: the TCP connection (Env.Dial's when set), its
// wrapping, the claimant told, the TLS handshake.
func (ep *Endpoint) dialNow(addr string, claimant *Hold) (net.Conn, error) {
	start := time.Now()
	var c net.Conn
	var err error
	if dial := ep.env.Dial; dial != nil {
		c, err = dial(addr)
	} else {
		d := net.Dialer{Timeout: ep.spec.connect}
		c, err = d.Dial("tcp", addr)
	}
	if err != nil {
		return nil, &DialError{err}
	}
	uc := ep.wrap(c)
	uc.rtt = time.Since(start) // the TCP handshake: one round trip
	uc.dialed.Store(true)
	if claimant != nil {
		claimant.using(uc)
	}
	if ep.tls == nil {
		return uc, nil
	}
	tc := tls.Client(uc, ep.tls)
	_ = tc.SetDeadline(time.Now().Add(ep.spec.connect))
	if err := tc.Handshake(); err != nil {
		_ = c.Close()
		return nil, &DialError{err}
	}
	_ = tc.SetDeadline(time.Time{})
	uc.requests.Store(0) // the handshake was not a request
	return tc, nil
}

// wrap makes c an upstreamConn with ep's idle timeout.
func (ep *Endpoint) wrap(c net.Conn) *upstreamConn {
	uc := &upstreamConn{Conn: c, idle: ep.spec.idle, ep: ep}
	uc.local = connAddr{Addr: c.LocalAddr(), conn: uc}
	return uc
}

// upstreamConn is an upstream connection with two read regimes. Until the
// request path has the first body bytes it keeps fasthttp's absolute
// deadline (first_byte, set by DoTimeout before reading the response).
// Once the request path marks it (MarkStreaming), every Read gets a fresh
// deadline of idle, so a long stream is never cut while it keeps flowing
// and a stalled one is.
// fasthttp sets a new deadline before each request on a pooled
// connection, which resets the regime.
type upstreamConn struct {
	net.Conn
	ep     *Endpoint
	idle   time.Duration
	stream atomic.Bool
	local  connAddr
	// requests counts the requests written on the connection; received
	// counts the bytes read since the current one was written. Together
	// they tell a stale keep-alive connection (see Stale).
	requests atomic.Int32
	received atomic.Int64
	writing  atomic.Bool
	// wroteAt is when the current request's first byte was written
	// (UnixNano); rtt is how long the connection took to open.
	wroteAt atomic.Int64
	rtt     time.Duration
	// until caps the streaming regime's deadlines (UnixNano; 0: none): a
	// route's max_duration.
	until atomic.Int64
	// dialed is set from dial until fasthttp's first LocalAddr of the new
	// connection, which must not take a claim: dial already gave it to
	// its attempt, and the claim waiting now is another attempt's.
	dialed atomic.Bool
	// user is the Hold the connection was last given to (using).
	user atomic.Pointer[Hold]
	// closed is set by Close: such a connection never goes back to the
	// pool (reusable).
	closed atomic.Bool
}

// Close closes the connection; it is never pooled after.
func (c *upstreamConn) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}

// reusable reports whether c may go back to the pool as a request
// finishes with it: not closed, by a client leaving (Hold.Sever) or
// anything else. It lets go of c's Hold either way (detach). A nil c
// (not Sturdy's connection) is.
func (c *upstreamConn) reusable() bool {
	if c == nil {
		return true
	}
	severed := c.detach()
	return !severed && !c.closed.Load()
}

// connOf is the connection resp arrived on; nil when it is not Sturdy's.
func connOf(resp *fasthttp.Response) *upstreamConn {
	if a, ok := resp.LocalAddr().(*connAddr); ok {
		return a.conn
	}
	return nil
}

// detach makes the Hold the connection was given to let go of it, when
// it still holds it, as the connection is going back to the pool. closed
// says that Hold was severed (its client left, or Shutdown cut it) while
// it held the connection, which is closed or about to be: not for the
// pool.
func (c *upstreamConn) detach() (closed bool) {
	if h := c.user.Swap(nil); h != nil {
		return h.letGo(c)
	}
	return false
}

// staleSlack is added to two round trips for how soon after the request
// was written a connection must die for the death to be "stale": sooner
// than the server could have done any work on the request.
const staleSlack = 10 * time.Millisecond

// connAddr is the connection's local address carrying a pointer back to
// the connection: fasthttp exposes it as Response.LocalAddr(), which is
// how the proxy finds the connection a response arrived on.
type connAddr struct {
	net.Addr
	conn *upstreamConn
}

// LocalAddr also hands the connection to an attempt waiting for one:
// fasthttp reads it right after taking the connection from its pool (and
// once after dialling it, which is not a new use).
func (c *upstreamConn) LocalAddr() net.Addr {
	if c.dialed.Swap(false) {
		return &c.local
	}
	if h := c.ep.takeClaim(); h != nil {
		h.using(c)
	}
	return &c.local
}

func (c *upstreamConn) SetReadDeadline(t time.Time) error {
	c.stream.Store(false)
	c.until.Store(0)
	return c.Conn.SetReadDeadline(t)
}

func (c *upstreamConn) Read(p []byte) (int, error) {
	if c.stream.Load() {
		d := time.Now().Add(c.idle)
		if u := c.until.Load(); u != 0 && u < d.UnixNano() {
			d = time.Unix(0, u)
		}
		if err := c.Conn.SetReadDeadline(d); err != nil {
			return 0, err
		}
	}
	c.writing.Store(false)
	n, err := c.Conn.Read(p)
	c.received.Add(int64(n))
	return n, err
}

func (c *upstreamConn) Write(p []byte) (int, error) {
	if !c.writing.Swap(true) {
		c.requests.Add(1)
		c.received.Store(0)
		c.wroteAt.Store(time.Now().UnixNano())
	}
	return c.Conn.Write(p)
}

// Stale reports whether a failed attempt died on a pooled
// keep-alive connection that the upstream had closed: reused, not one byte
// back for this request, and dead within two round trips (plus
// staleSlack) of the request being written — before the server could
// have worked on it. One that died later may have been processed (an
// upstream that crashes on the request): that is a reset. Policy decides
// whether a stale one is sent again (Retry.Decide).
func Stale(resp *fasthttp.Response) bool {
	a, ok := resp.LocalAddr().(*connAddr)
	if !ok || a.conn.requests.Load() <= 1 || a.conn.received.Load() != 0 {
		return false
	}
	return time.Since(time.Unix(0, a.conn.wroteAt.Load())) <= 2*a.conn.rtt+staleSlack
}

// MarkStreaming switches the connection resp arrived on to the idle
// regime.
func MarkStreaming(resp *fasthttp.Response) {
	if a, ok := resp.LocalAddr().(*connAddr); ok {
		a.conn.stream.Store(true)
	}
}

// CapReads makes no read on the connection resp arrived on wait past
// until (zero: no cap).
func CapReads(resp *fasthttp.Response, until time.Time) {
	if a, ok := resp.LocalAddr().(*connAddr); ok && !until.IsZero() {
		a.conn.until.Store(until.UnixNano())
	}
}

// Hold is what an attempt, then its stream, holds of the upstream
// connection it was given (Endpoint.Send hands it over), so that the
// connection can be closed when the client leaves or Shutdown cuts the
// stream (Sever) — which is what makes vLLM, Ollama and llama.cpp stop
// generating — and never once it went back to the pool. The zero Hold
// holds nothing; the request path keeps one per request.
type Hold struct {
	mu      sync.Mutex
	conn    *upstreamConn
	severed atomic.Bool
}

// Sever closes the connection held, if any, and any given to h from now
// on: the client left, or Shutdown cut the stream.
func (h *Hold) Sever() {
	h.severed.Store(true)
	h.mu.Lock()
	if c := h.conn; c != nil {
		_ = c.Close()
	}
	h.mu.Unlock()
}

// Severed reports whether Sever was called.
func (h *Hold) Severed() bool { return h.severed.Load() }

// using records the connection an attempt was given (see
// Endpoint.claimMu); if h was severed already (the client left, or
// Shutdown cut the stream a continuation is for), it is closed at once.
func (h *Hold) using(c *upstreamConn) {
	c.user.Store(h)
	h.mu.Lock()
	h.conn = c
	severed := h.severed.Load()
	h.mu.Unlock()
	if severed {
		_ = c.Close()
	}
}

// Drop forgets the connection: from now on it may serve another
// request, and must not be closed for this one. Only the request's own
// goroutine gives h a connection or drops it, so it looks without the
// lock first.
func (h *Hold) Drop() {
	if h.conn == nil {
		return
	}
	h.mu.Lock()
	h.conn = nil
	h.mu.Unlock()
}

// letGo forgets c if it is still the connection held: the transport is
// giving it back to the pool (upstreamConn.detach). It reports whether h
// was severed while holding it: Sever closed it, or would have.
func (h *Hold) letGo(c *upstreamConn) (closed bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conn != c {
		return false
	}
	h.conn = nil
	return h.severed.Load()
}

// unsent marks a failure on a connection before any byte of the request
// went out (its write deadline could not be set: it was closed). Like a
// stale connection's, the request may be sent again (Unsent).
type unsent struct{ err error }

func (e *unsent) Error() string {
	return "upstream connection failed before the request was written: " + e.err.Error()
}
func (e *unsent) Unwrap() error { return e.err }

// Unsent reports whether err failed an attempt before any byte of its
// request was written: a stale connection's failure, never a reset.
func Unsent(err error) bool {
	var u *unsent
	return errors.As(err, &u)
}

// DialError marks a failure to open a connection: the request provably
// never left Sturdy, so even a non-replayable write may be retried.
type DialError struct{ err error }

// LocalFault reports whether a dial failed on Sturdy's side (out of file
// descriptors), not the upstream's.
func (e *DialError) LocalFault() bool {
	return errors.Is(e.err, syscall.EMFILE) || errors.Is(e.err, syscall.ENFILE)
}

func (e *DialError) Error() string { return "dial upstream: " + e.err.Error() }
func (e *DialError) Unwrap() error { return e.err }

// IsTimeout reports whether err is a timeout: fasthttp's, or a net
// error's (a read deadline passing mid-body).
func IsTimeout(err error) bool {
	if errors.Is(err, fasthttp.ErrTimeout) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
