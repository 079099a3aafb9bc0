// Package proxy is Sturdy's fasthttp handler: it routes a request to an
// upstream, runs the attempt loop (breaker → send → classify → wait),
// commits the first reply worth giving and streams it to the client, and
// writes one access-log line per request.
//
// Decisions come from package policy; this package only does the I/O.
package proxy

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"reflect"
	"sort"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"sturdy/breaker"
	"sturdy/metrics"
	"sturdy/policy"
)

// Upstream configures one model server.
type Upstream struct {
	// Name identifies the upstream in routes, logs and error bodies.
	Name string
	// URL is scheme://host[:port][/prefix]; the request URI is appended.
	URL string
	// APIKey, when set, replaces the client's Authorization header.
	APIKey string
	// ConnectTimeout bounds dialling and the TLS handshake.
	ConnectTimeout time.Duration
	// FirstByteTimeout runs from sending the request to the first body byte.
	FirstByteTimeout time.Duration
	// IdleTimeout bounds each gap between reads of a streamed body.
	IdleTimeout time.Duration
	// MaxConnections caps open connections (one per in-flight request).
	MaxConnections int
	// Breaker configures the upstream's circuit breaker.
	Breaker breaker.Settings
	// RateLimit paces requests to the upstream; zero RequestsPerSecond
	// disables it.
	RateLimit RateLimit
	// MaxInFlight caps concurrent requests (streams included); 0 means
	// unlimited.
	MaxInFlight int
	// QueueTimeout is how long a request waits for a slot under
	// MaxInFlight.
	QueueTimeout time.Duration
	// RetryBudget caps retries to the upstream; the zero value means the
	// default (ratio 0.5, 10 per second).
	RetryBudget RetryBudget
	// CAFile adds PEM CAs to trust for an https upstream.
	CAFile string
	// InsecureSkipVerify turns off TLS verification of the upstream.
	InsecureSkipVerify bool
}

// ServerLimits bound how clients use the listener. Zero fields mean the
// defaults: 60 s, 120 s, 32 KiB.
type ServerLimits struct {
	// ReadTimeout bounds reading a whole request, headers and body.
	ReadTimeout time.Duration
	// IdleTimeout bounds a keep-alive connection between requests.
	IdleTimeout time.Duration
	// MaxHeaderBytes caps the request line and headers (431 above).
	MaxHeaderBytes int
}

// RateLimit paces requests below a provider's quota.
type RateLimit struct {
	// RequestsPerSecond is the sustained rate; 0 disables pacing.
	RequestsPerSecond float64
	// Burst is how many requests may go at once (≥ 1).
	Burst int
	// MaxWait is the longest a request waits for its turn.
	MaxWait time.Duration
}

// RetryBudget caps retries: within 10 s they may add Ratio of the first
// attempts plus MinPerSecond per second.
type RetryBudget struct {
	Ratio        float64
	MinPerSecond float64
}

// Target is a fallback: an upstream, with the body's "model" rewritten to
// Model when set.
type Target struct {
	Upstream string
	Model    string
}

// ClientLimit rate-limits each client, told apart by KeyHeader's value.
type ClientLimit struct {
	KeyHeader         string
	RequestsPerSecond float64
	Burst             int
}

// Route sends requests whose path starts with PathPrefix to Upstream.
type Route struct {
	// Name identifies the route in logs.
	Name string
	// PathPrefix is matched bytewise against the raw request path; the
	// longest match wins.
	PathPrefix string
	// Model, when set, is a glob the body's "model" must match.
	Model string
	// Upstream is an Upstream's Name: the primary target.
	Upstream string
	// Fallbacks are tried in order after Upstream.
	Fallbacks []Target
	// FirstToken, when set, bounds each attempt's wait for its first body
	// byte below the upstream's FirstByteTimeout.
	FirstToken time.Duration
	// FailoverOn lists 4xx statuses that move to the next target.
	FailoverOn []int
	// FailoverCodes lists 400 error codes that move to the next target.
	FailoverCodes []string
	// AttemptsOnClientRetry caps attempts per target when the client is
	// retrying on its own (X-Stainless-Retry-Count > 0); 0 means no cap.
	AttemptsOnClientRetry int
	// Deadline is the budget until the response starts, retries included.
	Deadline time.Duration
	// MaxBody is the largest request body accepted, in bytes.
	MaxBody int
	// Retry is the route's retry policy.
	Retry policy.Retry
}

// Options configures a Proxy.
type Options struct {
	Upstreams []Upstream
	Routes    []Route
	// Clients are per-client rate limits every request must pass.
	Clients []ClientLimit
	// AuthKeys, when set, are the keys clients must present as
	// "Authorization: Bearer <key>"; the client's Authorization is then
	// never forwarded upstream.
	AuthKeys []string
	// Server bounds the client-facing listener (fixed at New).
	Server ServerLimits
	// Log receives access lines and breaker transitions.
	Log zerolog.Logger
	// Rand returns a uniform value in [0, n) for backoff jitter; nil means
	// math/rand/v2.
	Rand func(n int64) int64
	// Metrics receives the proxy's measurements; nil means a private set.
	Metrics *metrics.Metrics
}

type route struct {
	name          string
	prefix        []byte
	model         string // glob, or "" for any
	specificity   int    // of model; -1 without one
	targets       []target
	upstream      *upstream // the primary: targets[0].up
	firstToken    time.Duration
	failoverOn    []int
	failoverCodes []string
	clientRetries int
	deadline      time.Duration
	maxBody       int
	retry         policy.Retry
	// Histograms of this route, resolved once.
	ttfb, durPlain, durStream prometheus.Observer
}

// target is one upstream a route may use, with its model rewrite.
type target struct {
	up    *upstream
	model string
}

// table is one generation of configuration: the routes and the
// upstreams they use. A request works with the table it started with, so
// a reload never changes a request in flight.
type table struct {
	routes    []*route // longest prefix first
	upstreams []*upstream
	clients   []*clientLimiter
	authKeys  [][sha256.Size]byte // hashes of the accepted client keys
	maxBody   int
}

// Proxy is the resilient reverse proxy. Create it with New and serve
// Handle (or Server()); Reload swaps its configuration live.
type Proxy struct {
	tbl      atomic.Pointer[table]
	log      zerolog.Logger
	rand     func(int64) int64
	m        *metrics.Metrics
	maxBody  int // the server's body limit, fixed at New
	limits   ServerLimits
	idPrefix string
	idSeq    atomic.Uint64
}

// New builds a Proxy. It fails on a route naming an unknown upstream or
// an invalid upstream URL.
func New(o Options) (*Proxy, error) {
	p := &Proxy{log: o.Log, rand: o.Rand, m: o.Metrics}
	if p.rand == nil {
		p.rand = mrand.Int64N
	}
	if p.m == nil {
		p.m = metrics.New()
	}
	var seed [4]byte
	_, _ = rand.Read(seed[:])
	p.idPrefix = hex.EncodeToString(seed[:]) + "-"
	t, _, err := p.buildTable(o, nil)
	if err != nil {
		return nil, err
	}
	p.maxBody = t.maxBody
	p.limits = o.Server
	if p.limits.ReadTimeout <= 0 {
		p.limits.ReadTimeout = 60 * time.Second
	}
	if p.limits.IdleTimeout <= 0 {
		p.limits.IdleTimeout = 120 * time.Second
	}
	if p.limits.MaxHeaderBytes <= 0 {
		p.limits.MaxHeaderBytes = 32 << 10
	}
	p.tbl.Store(t)
	return p, nil
}

// Reload makes o the configuration for new requests. Requests in flight
// finish with the configuration they started with. An upstream whose
// definition did not change keeps its connections and its breaker state.
// A route's max_body above the largest at New takes effect only after a
// restart (the server reads bodies up to that limit); Reload says so in
// its warnings.
func (p *Proxy) Reload(o Options) (warnings []string, err error) {
	old := p.tbl.Load()
	t, dropped, err := p.buildTable(o, old)
	if err != nil {
		return nil, err
	}
	if t.maxBody > p.maxBody {
		warnings = append(warnings, fmt.Sprintf("max_body above %d bytes takes effect after a restart", p.maxBody))
	}
	p.tbl.Store(t)
	for _, up := range dropped {
		up.client.CloseIdleConnections()
		p.m.BreakerState.DeleteLabelValues(up.name)
	}
	return warnings, nil
}

// buildTable builds a table from o, reusing the upstreams of prev whose
// options are unchanged; it also returns prev's upstreams left out.
func (p *Proxy) buildTable(o Options, prev *table) (*table, []*upstream, error) {
	reuse := map[string]*upstream{}
	if prev != nil {
		for _, up := range prev.upstreams {
			reuse[up.name] = up
		}
	}
	t := &table{}
	byName := map[string]*upstream{}
	for _, uo := range o.Upstreams {
		up := reuse[uo.Name]
		if up == nil || !reflect.DeepEqual(up.opts, uo) {
			var err error
			if up, err = newUpstream(uo, p.breakerChanged); err != nil {
				return nil, nil, err
			}
			p.m.BreakerState.WithLabelValues(up.name).Set(0)
		}
		byName[uo.Name] = up
		t.upstreams = append(t.upstreams, up)
	}
	for _, ro := range o.Routes {
		r := &route{name: ro.Name, prefix: []byte(ro.PathPrefix), model: ro.Model, specificity: -1,
			firstToken: ro.FirstToken, failoverOn: ro.FailoverOn, failoverCodes: ro.FailoverCodes,
			clientRetries: ro.AttemptsOnClientRetry, deadline: ro.Deadline, maxBody: ro.MaxBody, retry: ro.Retry}
		if ro.Model != "" {
			r.specificity = policy.GlobSpecificity(ro.Model)
		}
		r.ttfb = p.m.TimeToFirstByte.WithLabelValues(ro.Name)
		r.durPlain = p.m.Duration.WithLabelValues(ro.Name, "false")
		r.durStream = p.m.Duration.WithLabelValues(ro.Name, "true")
		for _, tg := range append([]Target{{Upstream: ro.Upstream}}, ro.Fallbacks...) {
			up := byName[tg.Upstream]
			if up == nil {
				return nil, nil, fmt.Errorf("route %q: unknown upstream %q", ro.Name, tg.Upstream)
			}
			r.targets = append(r.targets, target{up: up, model: tg.Model})
		}
		r.upstream = r.targets[0].up
		t.routes = append(t.routes, r)
		t.maxBody = max(t.maxBody, ro.MaxBody)
	}
	for _, k := range o.AuthKeys {
		t.authKeys = append(t.authKeys, sha256.Sum256([]byte(k)))
	}
	var prevClients []*clientLimiter
	if prev != nil {
		prevClients = prev.clients
	}
	for i, co := range o.Clients {
		if i < len(prevClients) && prevClients[i].opts == co {
			t.clients = append(t.clients, prevClients[i]) // keep the buckets
			continue
		}
		t.clients = append(t.clients, newClientLimiter(co))
	}
	sort.SliceStable(t.routes, func(i, j int) bool { return len(t.routes[i].prefix) > len(t.routes[j].prefix) })
	var dropped []*upstream
	if prev != nil {
		for _, up := range prev.upstreams {
			if byName[up.name] != up {
				dropped = append(dropped, up)
			}
		}
	}
	return t, dropped, nil
}

// breakerChanged logs a transition and exports it.
func (p *Proxy) breakerChanged(name string, from, to breaker.State) {
	ev := p.log.Warn()
	if to == breaker.StateClosed {
		ev = p.log.Info()
	}
	ev.Str("upstream", name).Str("from", from.String()).Str("to", to.String()).Msg("breaker state change")
	p.m.BreakerState.WithLabelValues(name).Set(float64(to))
	p.m.BreakerTransitions.WithLabelValues(name, to.String()).Inc()
}

// authorized reports whether the request carries an accepted client key
// (always true without auth). Every key is compared, in constant time, on
// hashes of equal length: timing tells nothing about the keys.
func (t *table) authorized(authorization []byte) bool {
	if len(t.authKeys) == 0 {
		return true
	}
	key, ok := bytes.CutPrefix(authorization, []byte("Bearer "))
	got := sha256.Sum256(key)
	match := 0
	for i := range t.authKeys {
		match |= subtle.ConstantTimeCompare(got[:], t.authKeys[i][:])
	}
	return ok && match == 1
}

// match returns the route for a request: among routes whose prefix
// starts path and whose model glob (if any) matches the body's "model",
// the longest prefix wins, then a route with a glob over one without,
// then the glob with more literal characters. The body is parsed only
// when a candidate route has a model glob.
func (t *table) match(path, body []byte) *route {
	var best *route
	model, parsed := "", false
	for _, r := range t.routes {
		if best != nil && len(r.prefix) < len(best.prefix) {
			break // sorted by prefix length, longest first
		}
		if !bytes.HasPrefix(path, r.prefix) {
			continue
		}
		if r.model != "" {
			if !parsed {
				model, parsed = gjson.GetBytes(body, "model").String(), true
			}
			if !policy.GlobMatch(r.model, model) {
				continue
			}
		}
		if best == nil || r.specificity > best.specificity {
			best = r
		}
	}
	return best
}

// Server returns a fasthttp server set up for proxying: bodies up to the
// largest route's max_body, no headers of its own invented, no write
// timeout (it would cut long streams), parse errors answered in the
// OpenAI error shape, its own logging through zerolog.
func (p *Proxy) Server() *fasthttp.Server {
	return &fasthttp.Server{
		Handler:                      p.Handle,
		ErrorHandler:                 p.handleParseError,
		Logger:                       fasthttpLogger{p.log},
		MaxRequestBodySize:           p.maxBody,
		ReadBufferSize:               p.limits.MaxHeaderBytes,
		ReadTimeout:                  p.limits.ReadTimeout,
		IdleTimeout:                  p.limits.IdleTimeout,
		NoDefaultServerHeader:        true,
		NoDefaultDate:                true,
		NoDefaultContentType:         true,
		DisablePreParseMultipartForm: true,
		CloseOnShutdown:              true,
		SecureErrorLogMessage:        true,
	}
}

// CloseIdleConnections closes pooled upstream connections (at shutdown).
func (p *Proxy) CloseIdleConnections() {
	for _, up := range p.tbl.Load().upstreams {
		up.client.CloseIdleConnections()
	}
}

// fasthttpLogger sends fasthttp's own messages through zerolog, so a JSON
// log stays JSON.
type fasthttpLogger struct{ log zerolog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	l.log.Warn().Str("component", "fasthttp").Msgf(format, args...)
}

// handleParseError answers requests fasthttp could not read.
func (p *Proxy) handleParseError(ctx *fasthttp.RequestCtx, err error) {
	status, code, msg := 400, CodeBadRequest, "malformed HTTP request: "+err.Error()
	var small *fasthttp.ErrSmallBuffer
	switch {
	case err == fasthttp.ErrBodyTooLarge:
		status, code = 413, CodeRequestTooLarge
		msg = fmt.Sprintf("request body is larger than the %d bytes Sturdy accepts; send a smaller request", p.maxBody)
	case errors.As(err, &small):
		status, msg = 431, "request headers are too large"
	}
	id := p.appendRequestID(nil)
	writeError(ctx, status, code, msg, errorDetails{}, 0)
	ctx.Response.Header.SetBytesKV(hdrRequestID, id)
	ctx.SetConnectionClose()
	p.log.Info().Bytes(fieldID, id).Str(fieldOutcome, outcomeRejected).Int(fieldStatus, status).Str(fieldError, code).Msg("request")
	p.m.Requests.WithLabelValues("", "", metrics.StatusClass(status), outcomeRejected).Inc()
}

// appendRequestID appends a process-unique request id: a random prefix
// per process and a sequence number, in hex.
func (p *Proxy) appendRequestID(dst []byte) []byte {
	dst = append(dst, p.idPrefix...)
	n := p.idSeq.Add(1)
	var digits [16]byte
	i := len(digits)
	for n > 0 || i > len(digits)-8 {
		i--
		digits[i] = "0123456789abcdef"[n&15]
		n >>= 4
	}
	return append(dst, digits[i:]...)
}
