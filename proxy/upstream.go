package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"

	"sturdy/breaker"
	"sturdy/policy"
)

// maxIdleConnDuration keeps pooled upstream connections below the idle
// timeouts of common model servers (vLLM closes after 5 s), so Sturdy
// rarely sends a request on a connection the server is closing.
const maxIdleConnDuration = 4 * time.Second

// upstreamReadBuffer also caps the size of an upstream's response headers:
// hosted APIs send many.
const upstreamReadBuffer = 64 << 10

// upstream is one model server: its connection pool and its breaker.
type upstream struct {
	name string
	opts Upstream // as configured, to tell a changed definition on reload
	// base is scheme://host[:port][/prefix] without a trailing slash; the
	// client's request URI is appended to it as received.
	base      []byte
	auth      []byte // "Bearer <api_key>", or nil to pass the client's
	firstByte time.Duration
	idle      time.Duration
	connect   time.Duration
	tls       *tls.Config
	client    *fasthttp.HostClient
	breaker   *breaker.Breaker
	// inFlight counts requests using this upstream, streams included.
	inFlight atomic.Int64

	// Traffic policy: pacing (nil: none), concurrency slots (nil:
	// unlimited), retry budget, cooldowns learned from 429s.
	limiter      *rate.Limiter
	maxWait      time.Duration
	slots        slots
	queueTimeout time.Duration
	budget       *policy.Budget
	cooldowns    cooldowns

	// attempts holds this upstream's attempt counters by result, resolved
	// once instead of per request.
	attempts sync.Map // result label → prometheus.Counter
}

// countAttempt counts an attempt's result.
func (up *upstream) countAttempt(p *Proxy, result string) {
	c, ok := up.attempts.Load(result)
	if !ok {
		c, _ = up.attempts.LoadOrStore(result, p.m.Attempts.WithLabelValues(up.name, result))
	}
	c.(prometheus.Counter).Inc()
}

func newUpstream(o Upstream, onState func(name string, from, to breaker.State)) (*upstream, error) {
	u, err := url.Parse(o.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("upstream %q: invalid url %q", o.Name, o.URL)
	}
	isTLS := u.Scheme == "https"
	up := &upstream{
		name:      o.Name,
		opts:      o,
		base:      []byte(u.Scheme + "://" + u.Host + strings.TrimSuffix(u.EscapedPath(), "/")),
		firstByte: o.FirstByteTimeout,
		idle:      o.IdleTimeout,
		connect:   o.ConnectTimeout,
	}
	if o.APIKey != "" {
		up.auth = []byte("Bearer " + o.APIKey)
	}
	if isTLS {
		up.tls = &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12, InsecureSkipVerify: o.InsecureSkipVerify} // #nosec G402 -- opt-in, documented as test-only
		if o.CAFile != "" {
			pool, err := x509.SystemCertPool()
			if err != nil {
				pool = x509.NewCertPool()
			}
			pem, err := os.ReadFile(o.CAFile)
			if err != nil || !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("upstream %q: cannot read PEM certificates from ca_file %q", o.Name, o.CAFile)
			}
			up.tls.RootCAs = pool
		}
	}
	if o.RateLimit.RequestsPerSecond > 0 {
		up.limiter = rate.NewLimiter(rate.Limit(o.RateLimit.RequestsPerSecond), max(o.RateLimit.Burst, 1))
		up.maxWait = o.RateLimit.MaxWait
	}
	if o.MaxInFlight > 0 {
		up.slots = make(slots, o.MaxInFlight)
		up.queueTimeout = o.QueueTimeout
	}
	rb := o.RetryBudget
	if rb == (RetryBudget{}) {
		rb = RetryBudget{Ratio: 0.5, MinPerSecond: 10}
	}
	up.budget = &policy.Budget{Ratio: rb.Ratio, MinPerSecond: rb.MinPerSecond}
	bs := o.Breaker
	bs.OnStateChange = onState
	up.breaker = breaker.New(o.Name, bs)
	up.client = &fasthttp.HostClient{
		Addr:                fasthttp.AddMissingPort(u.Host, isTLS),
		IsTLS:               isTLS,
		Dial:                up.dial,
		MaxConns:            o.MaxConnections,
		MaxConnWaitTimeout:  o.FirstByteTimeout,
		MaxIdleConnDuration: maxIdleConnDuration,
		// Sturdy owns every retry: fasthttp's own are off.
		MaxIdemponentCallAttempts: 1,
		RetryIfErr:                func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
		ReadBufferSize:            upstreamReadBuffer,
		DisablePathNormalizing:    true,
		NoDefaultUserAgentHeader:  true,
		StreamResponseBody:        true,
		SecureErrorLogMessage:     true,
	}
	return up, nil
}

// dial opens a connection within the connect timeout, TLS handshake
// included, and wraps it so reads of a streamed body are bounded by the
// idle timeout instead of one deadline for the whole stream.
func (up *upstream) dial(addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: up.connect}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, &dialError{err}
	}
	uc := &upstreamConn{Conn: c, idle: up.idle}
	uc.local = connAddr{Addr: c.LocalAddr(), conn: uc}
	if up.tls == nil {
		return uc, nil
	}
	tc := tls.Client(uc, up.tls)
	_ = tc.SetDeadline(time.Now().Add(up.connect))
	if err := tc.Handshake(); err != nil {
		_ = c.Close()
		return nil, &dialError{err}
	}
	_ = tc.SetDeadline(time.Time{})
	uc.requests.Store(0) // the handshake was not a request
	return tc, nil
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
	idle   time.Duration
	stream atomic.Bool
	local  connAddr
	// requests counts the requests written on the connection; received
	// counts the bytes read since the current one was written. Together
	// they tell a stale keep-alive connection (see staleConnection).
	requests atomic.Int32
	received atomic.Int64
	writing  atomic.Bool
}

// connAddr is the connection's local address carrying a pointer back to
// the connection: fasthttp exposes it as Response.LocalAddr(), which is
// how the proxy finds the connection a response arrived on.
type connAddr struct {
	net.Addr
	conn *upstreamConn
}

func (c *upstreamConn) LocalAddr() net.Addr { return &c.local }

func (c *upstreamConn) SetReadDeadline(t time.Time) error {
	c.stream.Store(false)
	return c.Conn.SetReadDeadline(t)
}

func (c *upstreamConn) Read(p []byte) (int, error) {
	if c.stream.Load() {
		if err := c.Conn.SetReadDeadline(time.Now().Add(c.idle)); err != nil {
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
	}
	return c.Conn.Write(p)
}

// staleConnection reports whether a failed attempt died on a pooled
// keep-alive connection that the upstream had closed: reused, and not one
// byte came back for this request. The request was almost surely never
// processed, so a replayable one is sent again at once on a fresh
// connection, without counting as an attempt.
func staleConnection(resp *fasthttp.Response) bool {
	a, ok := resp.LocalAddr().(*connAddr)
	return ok && a.conn.requests.Load() > 1 && a.conn.received.Load() == 0
}

// markStreaming switches the connection resp arrived on to the idle
// regime.
func markStreaming(resp *fasthttp.Response) {
	if a, ok := resp.LocalAddr().(*connAddr); ok {
		a.conn.stream.Store(true)
	}
}
