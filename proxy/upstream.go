package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
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
	// conns holds a place per open connection (max_connections): an
	// attempt takes one before it is sent and gives it back when its body
	// is closed, so fasthttp never waits for a connection itself.
	conns     slots
	budget    *policy.Budget
	cooldowns cooldowns
	// bareCooldown is the first cooldown of a 429 without a wait; 0 when
	// cooldowns are off.
	bareCooldown time.Duration
	// models are the reply breakers per model as sent (breaker is the
	// connection breaker).
	models *breaker.Group

	// claimMu and claimant tell which connection fasthttp gives an
	// attempt: send holds claimMu and names the attempt's exchange; the
	// connection fasthttp then dials or takes from its pool (dial, or
	// LocalAddr when fasthttp reads its addresses) takes the claim and
	// unlocks. Every request to the upstream goes through send.
	claimMu  sync.Mutex
	claimant atomic.Pointer[exchange]

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

// send sends ex's request and reads the response head within timeout,
// with the connection it goes on known to ex (so it can be closed if the
// client leaves).
func (up *upstream) send(ex *exchange, resp *fasthttp.Response, timeout time.Duration) error {
	up.claimMu.Lock()
	up.claimant.Store(ex)
	err := up.client.DoTimeout(ex.req.msg, resp, timeout)
	if up.claimant.CompareAndSwap(ex, nil) { // no connection was given
		up.claimMu.Unlock()
	}
	return err
}

// takeClaim hands the connection being given out to the attempt that
// claimed it, if one waits.
func (up *upstream) takeClaim() *exchange {
	ex := up.claimant.Swap(nil)
	if ex != nil {
		up.claimMu.Unlock()
	}
	return ex
}

// newUpstream builds an upstream from o, its defaults filled.
func newUpstream(o Upstream, onState, onModelState func(name string, from, to breaker.State)) (*upstream, error) {
	u, err := url.Parse(o.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("upstream %q: invalid url %q", o.Name, o.URL)
	}
	up := &upstream{
		name:      o.Name,
		opts:      o,
		base:      []byte(u.Scheme + "://" + u.Host + strings.TrimSuffix(u.EscapedPath(), "/")),
		firstByte: o.FirstByteTimeout,
		idle:      o.IdleTimeout,
		connect:   o.ConnectTimeout,
		budget:    &policy.Budget{Ratio: o.RetryBudget.Ratio, MinPerSecond: o.RetryBudget.MinPerSecond},
		conns:     make(slots, o.MaxConnections),
	}
	if o.APIKey != "" {
		up.auth = []byte("Bearer " + o.APIKey)
	}
	if u.Scheme == "https" {
		if up.tls, err = tlsConfig(o, u.Hostname()); err != nil {
			return nil, err
		}
	}
	if o.RateLimit.RequestsPerSecond > 0 {
		up.limiter = rate.NewLimiter(rate.Limit(o.RateLimit.RequestsPerSecond), o.RateLimit.Burst)
		up.maxWait = o.RateLimit.MaxWait
	}
	up.queueTimeout = o.QueueTimeout
	if o.MaxInFlight > 0 {
		up.slots = make(slots, o.MaxInFlight)
	}
	if !o.Cooldown.Off {
		up.bareCooldown = o.Cooldown.WithoutHeader
	}
	bs := o.Breaker
	bs.OnStateChange = onState
	up.breaker = breaker.New(o.Name, bs)
	ms := o.Breaker
	ms.OnStateChange = onModelState
	up.models = breaker.NewGroup(o.Name, breaker.GroupSettings{Breaker: ms})
	up.client = &fasthttp.HostClient{
		Addr:                fasthttp.AddMissingPort(u.Host, up.tls != nil),
		IsTLS:               up.tls != nil,
		Dial:                up.dial,
		MaxConns:            o.MaxConnections,
		MaxConnWaitTimeout:  o.QueueTimeout, // conns makes this wait rare: a connection still closing
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

// tlsConfig verifies an https upstream by its host name, trusting the
// system's CAs and o.CAFile's.
func tlsConfig(o Upstream, host string) (*tls.Config, error) {
	c := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12, InsecureSkipVerify: o.InsecureSkipVerify} // #nosec G402 -- opt-in, documented as test-only
	if o.CAFile == "" {
		return c, nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	pem, err := os.ReadFile(o.CAFile)
	if err != nil || !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("upstream %q: cannot read PEM certificates from ca_file %q", o.Name, o.CAFile)
	}
	c.RootCAs = pool
	return c, nil
}
