package proxy

import (
	"crypto/tls"
	"net"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// maxIdleConnDuration keeps pooled upstream connections below the idle
// timeouts of common model servers (vLLM closes after 5 s), so Sturdy
// rarely sends a request on a connection the server is closing.
const maxIdleConnDuration = 4 * time.Second

// upstreamReadBuffer also caps the size of an upstream's response headers:
// hosted APIs send many.
const upstreamReadBuffer = 64 << 10

// dial opens a connection within the connect timeout, TLS handshake
// included, and wraps it so reads of a streamed body are bounded by the
// idle timeout instead of one deadline for the whole stream.
func (ep *endpoint) dial(addr string) (net.Conn, error) {
	claimant := ep.takeClaim() // before the dial: others need not wait for it
	d := net.Dialer{Timeout: ep.spec.connect}
	start := time.Now()
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, &dialError{err}
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
		return nil, &dialError{err}
	}
	_ = tc.SetDeadline(time.Time{})
	uc.requests.Store(0) // the handshake was not a request
	return tc, nil
}

// wrap makes c an upstreamConn with ep's idle timeout.
func (ep *endpoint) wrap(c net.Conn) *upstreamConn {
	uc := &upstreamConn{Conn: c, idle: ep.spec.idle, ep: ep}
	uc.local = connAddr{Addr: c.LocalAddr(), conn: uc}
	return uc
}

// upstreamConn is an upstream connection with two read regimes. Until the
// proxy has the first body bytes it keeps fasthttp's absolute deadline
// (first_byte, set by DoTimeout before reading the response). Once the
// proxy calls streaming(), every Read gets a fresh deadline of idle, so a
// long stream is never cut while it keeps flowing and a stalled one is.
// fasthttp sets a new deadline before each request on a pooled
// connection, which resets the regime.
type upstreamConn struct {
	net.Conn
	ep     *endpoint
	idle   time.Duration
	stream atomic.Bool
	local  connAddr
	// requests counts the requests written on the connection; received
	// counts the bytes read since the current one was written. Together
	// they tell a stale keep-alive connection (see staleConnection).
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
	// user is the exchange the connection was last given to (using).
	user atomic.Pointer[exchange]
}

// detach makes the exchange the connection was given to let go of it,
// when it still holds it, as the connection is going back to the pool.
// closed says that exchange's client left (or Shutdown cut it) while it
// held the connection, which is closed or about to be: not for the pool.
func (c *upstreamConn) detach() (closed bool) {
	if ex := c.user.Swap(nil); ex != nil {
		return ex.letGo(c)
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
	if ex := c.ep.takeClaim(); ex != nil {
		ex.using(c)
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

// staleConnection reports whether a failed attempt died on a pooled
// keep-alive connection that the upstream had closed: reused, not one byte
// back for this request, and dead within two round trips (plus
// staleSlack) of the request being written — before the server could
// have worked on it. One that died later may have been processed (an
// upstream that crashes on the request): that is a reset. Policy decides
// whether a stale one is sent again (Retry.Decide).
func staleConnection(resp *fasthttp.Response) bool {
	a, ok := resp.LocalAddr().(*connAddr)
	if !ok || a.conn.requests.Load() <= 1 || a.conn.received.Load() != 0 {
		return false
	}
	return time.Since(time.Unix(0, a.conn.wroteAt.Load())) <= 2*a.conn.rtt+staleSlack
}

// markStreaming switches the connection resp arrived on to the idle
// regime.
func markStreaming(resp *fasthttp.Response) {
	if a, ok := resp.LocalAddr().(*connAddr); ok {
		a.conn.stream.Store(true)
	}
}

// capReads makes no read on c wait past until (zero: no cap).
func (c *upstreamConn) capReads(until time.Time) {
	if !until.IsZero() {
		c.until.Store(until.UnixNano())
	}
}
