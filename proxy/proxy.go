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
	"sort"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"sturdy/breaker"
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
}

type route struct {
	name     string
	prefix   []byte
	upstream *upstream
	deadline time.Duration
	maxBody  int
	retry    policy.Retry
}

// Proxy is the resilient reverse proxy. Create it with New and serve
// Handle (or Server()).
type Proxy struct {
	routes    []*route // longest prefix first
	upstreams []*upstream
	log       zerolog.Logger
	rand      func(int64) int64
	maxBody   int
	idPrefix  string
	idSeq     atomic.Uint64
}

// New builds a Proxy. It fails on a route naming an unknown upstream or
// an invalid upstream URL.
func New(o Options) (*Proxy, error) {
	p := &Proxy{log: o.Log, rand: o.Rand}
	if p.rand == nil {
		p.rand = mrand.Int64N
	}
	var seed [4]byte
	_, _ = rand.Read(seed[:])
	p.idPrefix = hex.EncodeToString(seed[:]) + "-"
	byName := map[string]*upstream{}
	for _, uo := range o.Upstreams {
		up, err := newUpstream(uo, p.logBreakerChange)
		if err != nil {
			return nil, err
		}
		byName[uo.Name] = up
		p.upstreams = append(p.upstreams, up)
	}
	for _, ro := range o.Routes {
		up := byName[ro.Upstream]
		if up == nil {
			return nil, fmt.Errorf("route %q: unknown upstream %q", ro.Name, ro.Upstream)
		}
		p.routes = append(p.routes, &route{name: ro.Name, prefix: []byte(ro.PathPrefix), upstream: up,
			deadline: ro.Deadline, maxBody: ro.MaxBody, retry: ro.Retry})
		p.maxBody = max(p.maxBody, ro.MaxBody)
	}
	sort.SliceStable(p.routes, func(i, j int) bool { return len(p.routes[i].prefix) > len(p.routes[j].prefix) })
	return p, nil
}

func (p *Proxy) logBreakerChange(name string, from, to breaker.State) {
	ev := p.log.Warn()
	if to == breaker.StateClosed {
		ev = p.log.Info()
	}
	ev.Str("upstream", name).Str("from", from.String()).Str("to", to.String()).Msg("breaker state change")
}

// match returns the route with the longest prefix of path, or nil.
func (p *Proxy) match(path []byte) *route {
	for _, r := range p.routes {
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
	for _, up := range p.upstreams {
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
