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
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"reflect"
	"sort"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
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
}

// Route sends requests whose path starts with PathPrefix to Upstream.
type Route struct {
	// Name identifies the route in logs.
	Name string
	// PathPrefix is matched bytewise against the raw request path; the
	// longest match wins.
	PathPrefix string
	// Upstream is an Upstream's Name.
	Upstream string
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
	// Log receives access lines and breaker transitions.
	Log zerolog.Logger
	// Rand returns a uniform value in [0, n) for backoff jitter; nil means
	// math/rand/v2.
	Rand func(n int64) int64
	// Metrics receives the proxy's measurements; nil means a private set.
	Metrics *metrics.Metrics
}

type route struct {
	name     string
	prefix   []byte
	upstream *upstream
	deadline time.Duration
	maxBody  int
	retry    policy.Retry
}

// table is one generation of configuration: the routes and the
// upstreams they use. A request works with the table it started with, so
// a reload never changes a request in flight.
type table struct {
	routes    []*route // longest prefix first
	upstreams []*upstream
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
		up := byName[ro.Upstream]
		if up == nil {
			return nil, nil, fmt.Errorf("route %q: unknown upstream %q", ro.Name, ro.Upstream)
		}
		t.routes = append(t.routes, &route{name: ro.Name, prefix: []byte(ro.PathPrefix), upstream: up,
			deadline: ro.Deadline, maxBody: ro.MaxBody, retry: ro.Retry})
		t.maxBody = max(t.maxBody, ro.MaxBody)
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

// match returns the route with the longest prefix of path, or nil.
func (t *table) match(path []byte) *route {
	for _, r := range t.routes {
		if bytes.HasPrefix(path, r.prefix) {
			return r
		}
	}
	return nil
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
		ReadBufferSize:               32 << 10,
		ReadTimeout:                  60 * time.Second,
		IdleTimeout:                  120 * time.Second,
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
	case asSmallBuffer(err, &small):
		status, msg = 431, "request headers are too large"
	}
	writeError(ctx, status, code, msg, errorDetails{}, 0)
	ctx.SetConnectionClose()
	p.log.Info().Str(fieldOutcome, "rejected").Int(fieldStatus, status).Str("error", code).Msg("request")
	p.m.Requests.WithLabelValues("", "", metrics.StatusClass(status), "rejected").Inc()
}

func asSmallBuffer(err error, target **fasthttp.ErrSmallBuffer) bool {
	e, ok := err.(*fasthttp.ErrSmallBuffer)
	if ok {
		*target = e
	}
	return ok
}

// newRequestID returns a process-unique request id.
func (p *Proxy) appendRequestID(dst []byte) []byte {
	dst = append(dst, p.idPrefix...)
	return fmt.Appendf(dst, "%08x", p.idSeq.Add(1))
}
