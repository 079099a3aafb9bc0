package proxy

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"sturdy/listener"
	"sturdy/metrics"
	"sturdy/policy"
	"sturdy/upstream"
)

// Proxy is the resilient reverse proxy. Create it with New and serve
// clients with Serve or ServeTLS (the listener guard and the lean server
// come with them; Handle alone serves requests without either); Reload
// swaps its configuration live; Shutdown stops it.
type Proxy struct {
	tbl atomic.Pointer[table]
	// fleet is the connection to the fleet's shared state (nil: none).
	fleet atomic.Pointer[shared]
	// tracers trace requests: the current one (nil: tracing off) and
	// those a reload replaced, still exporting their requests' spans.
	tracers tracers
	log     zerolog.Logger
	rand    func(int64) int64
	m       *metrics.Metrics
	// env is what its upstreams share (package upstream).
	env     *upstream.Env
	maxBody int // the server's body limit, fixed at New
	limits  ServerLimits
	// held is the budget of bytes held on behalf of clients
	// (server.max_buffered_bytes).
	held heldBytes
	// bodies is the budget of request bodies held, all requests in
	// flight together (server.max_request_bytes).
	bodies   heldBytes
	idPrefix string
	idSeq    atomic.Uint64
	// via is this process's Via entry ("1.1 sturdy-<random>", and
	// "1.0 …" for an HTTP/1.0 client's request); viaID its random part,
	// which a request already carrying has looped back (508).
	via, via10, viaID []byte
	// stopping is closed when shutdown begins: every wait in progress
	// ends, and none starts.
	stopping   chan struct{}
	stopOnce   sync.Once
	serverOnce sync.Once
	server     *fasthttp.Server
	// lean is the server's twin with fasthttp's ReduceMemoryUsage, for
	// the connections opened past server.reduce_memory_above (nil when
	// server.reduce_memory already makes the server lean), taken from a
	// listener.Handoff that stops once stopping is closed.
	lean         *fasthttp.Server
	shutdownOnce sync.Once
	// reloadMu orders a reload with Shutdown's last step; closed is set
	// there, once the fleet's connection and the tracers are closed: a
	// reload after it would open new ones nothing closes (errShutDown).
	reloadMu sync.Mutex
	closed   bool
	// draining is set from Drain on: readiness fails so load balancers
	// stop sending, while requests are still served.
	draining atomic.Bool
	// streams are the responses streaming now, for Shutdown to end with
	// an interruption event once its grace is over.
	streams openStreams
	// failures are the newest failed requests, for the status page.
	failures failureRing
}

// New builds a Proxy. It fails on a route naming an unknown upstream or
// an invalid upstream URL.
func New(o Options) (*Proxy, error) {
	p := &Proxy{log: o.Log, rand: o.Rand, m: o.Metrics, limits: o.Server.withDefaults(), stopping: make(chan struct{}),
		streams: openStreams{m: map[*stream]struct{}{}}}
	if p.rand == nil {
		p.rand = mrand.Int64N
	}
	if p.m == nil {
		p.m = metrics.New()
	}
	p.held.full, p.bodies.full = p.m.BufferFull, p.m.BufferFull
	p.env = &upstream.Env{Log: p.log, Metrics: p.m, Lookup: o.LookupHost, IsSelf: o.IsSelf, Stopping: p.stopping,
		Evicted: func(name string) func() { return evictions(p.m, name) }, Announcer: func() func(upstream, endpoint string, until time.Time) { return p.fleet.Load().breakerAnnouncer() },
		ModelLabel: func(model string) string { return p.tbl.Load().modelLabel(model) }}
	if p.env.IsSelf == nil {
		p.env.IsSelf = func(string) bool { return false }
	}
	if p.env.Lookup == nil {
		p.env.Lookup = net.DefaultResolver.LookupHost
	}
	var seed [4]byte
	_, _ = rand.Read(seed[:])
	p.idPrefix = hex.EncodeToString(seed[:]) + "-"
	var via [8]byte
	_, _ = rand.Read(via[:])
	p.viaID = []byte("sturdy-" + hex.EncodeToString(via[:]))
	p.via, p.via10 = append([]byte("1.1 "), p.viaID...), append([]byte("1.0 "), p.viaID...)
	t, _, err := buildTable(o, nil, p.env, p.m)
	if err != nil {
		return nil, err
	}
	p.maxBody = t.maxBody
	p.held.max.Store(p.limits.MaxBufferedBytes)
	p.bodies.max.Store(p.limits.MaxRequestBytes)
	// The table first: the fleet, once started, hands over the cooldowns
	// other replicas learned (sharedCooldown looks their upstreams up).
	p.tbl.Store(t)
	if err := p.startShared(o.SharedState); err != nil {
		return nil, err
	}
	if err := p.tracers.start(o.Tracing, &p.log); err != nil {
		return nil, err
	}
	p.startUpstreams(t, nil)
	return p, nil
}

// Reload makes o the configuration for new requests. Requests in flight
// finish with the configuration they started with. An upstream whose
// definition did not change keeps its connections and its breaker state.
// A route's max_body above the largest at New takes effect only after a
// restart (the server reads bodies up to that limit); Reload says so in
// its warnings.
func (p *Proxy) Reload(o Options) (warnings []string, err error) {
	p.reloadMu.Lock()
	defer p.reloadMu.Unlock()
	if p.closed {
		return nil, errShutDown
	}
	old := p.tbl.Load()
	t, dropped, err := buildTable(o, old, p.env, p.m)
	if err != nil {
		return nil, err
	}
	if t.maxBody > p.maxBody {
		warnings = append(warnings, fmt.Sprintf("max_body above %d bytes takes effect after a restart", p.maxBody))
	}
	if err := p.startShared(o.SharedState); err != nil {
		return nil, err
	}
	if err := p.tracers.start(o.Tracing, &p.log); err != nil {
		return nil, err
	}
	p.held.max.Store(o.Server.withDefaults().MaxBufferedBytes)
	p.bodies.max.Store(o.Server.withDefaults().MaxRequestBytes)
	p.tbl.Store(t)
	p.startUpstreams(t, dropped)
	return warnings, nil
}

// The per-key maps, as sturdy_evictions_total names them.
const mapClients = "clients" // the others are the upstream side's (upstream.Env.Evicted)

// Server returns the proxy's fasthttp server (the same one on every
// call), set up for proxying: bodies up to the largest route's max_body,
// no headers of its own invented, no write timeout (it would cut long
// streams), parse errors answered in the OpenAI error shape, its own
// logging through zerolog. Through Serve and ServeTLS, connections
// opened while server.reduce_memory_above are open go to its lean twin
// instead (leanServer), and Proxy.Shutdown stops both: a server served
// or stopped by hand has no twin.
func (p *Proxy) Server() *fasthttp.Server {
	p.serverOnce.Do(func() {
		p.server = p.newServer(p.limits.ReduceMemory)
		if !p.limits.ReduceMemory {
			p.lean = p.newServer(true)
		}
	})
	return p.server
}

// leanServer returns the server's twin with fasthttp's ReduceMemoryUsage
// (an idle connection gives its context and buffers back between
// requests), or nil when the server itself has it.
func (p *Proxy) leanServer() *fasthttp.Server {
	p.Server()
	return p.lean
}

// newServer is Server's fasthttp server, lean with reduce.
func (p *Proxy) newServer(reduce bool) *fasthttp.Server {
	return &fasthttp.Server{
		Handler:                      p.Handle,
		HeaderReceived:               func(h *fasthttp.RequestHeader) fasthttp.RequestConfig { return bodyRoom(&p.bodies, h) },
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
		ReduceMemoryUsage:            reduce,
	}
}

// Drain makes Ready report false from now on — load balancers stop
// sending — while requests go on being served (a sidecar's agent may
// still be finishing its work). Shutdown drains too.
func (p *Proxy) Drain() { p.draining.Store(true) }

// Draining reports whether Drain (or Shutdown) was called.
func (p *Proxy) Draining() bool { return p.draining.Load() }

// streamGraceEnd bounds how long, after Shutdown's grace, the streams it
// interrupted get to write their interruption event.
const streamGraceEnd = time.Second

// errShutDown is why a reload after Shutdown's end is not applied.
var errShutDown = errors.New("Sturdy has shut down: the reload is not applied")

// Shutdown stops the proxy gracefully: readiness fails (Drain), every
// wait in progress (backoff, Retry-After, cooldown, pacing, a
// max_in_flight slot) ends at once — its request gets its last upstream
// reply, or 503 shutting_down — the server stops accepting and closes
// idle client connections, and requests and streams in flight finish
// until ctx ends. Streams still open then end with a stream_interrupted
// event (and their access-log line) instead of a bare cut. Idle upstream
// connections are closed last, and then the tracers and the fleet's
// connection (shared_state: its token leases given back, their spend
// settled); a reload from then on is refused. It returns ctx's error if
// the grace ran out.
func (p *Proxy) Shutdown(ctx context.Context) error {
	p.Drain()
	p.stopOnce.Do(func() { close(p.stopping) })
	var err error
	p.shutdownOnce.Do(func() {
		if err = p.shutdownServers(ctx); err != nil {
			p.interruptStreams()
		}
		p.CloseIdleConnections()
		p.reloadMu.Lock() // a reload in progress finishes first; none starts after
		p.closed = true
		p.reloadMu.Unlock()
		p.tracers.stop(&p.log)
		if f := p.fleet.Load(); f != nil {
			f.st.Close()
		}
	})
	return err
}

// shutdownServers stops the server and its lean twin at once (each
// stops accepting and closes its idle connections, then waits for its
// requests in flight) and returns the first error.
func (p *Proxy) shutdownServers(ctx context.Context) error {
	lean := p.leanServer()
	if lean == nil {
		return p.server.ShutdownWithContext(ctx)
	}
	errs := make(chan error, 1)
	go func() { errs <- lean.ShutdownWithContext(ctx) }()
	err := p.server.ShutdownWithContext(ctx)
	return cmp.Or(err, <-errs)
}

// interruptStreams ends every open stream with an interruption event and
// waits, up to streamGraceEnd, for them to be written.
func (p *Proxy) interruptStreams() {
	p.streams.interrupt()
	for deadline := time.Now().Add(streamGraceEnd); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if p.streams.count() == 0 {
			return
		}
	}
}

// Upstreams reports the state of every configured upstream, for the
// admin listener's /debug/upstreams (upstream.Status: no secret in it).
func (p *Proxy) Upstreams() []upstream.Status { return p.tbl.Load().status(time.Now()) }

// Clients is page page (from 1) of perPage (at most MaxClientsPerPage)
// of the clients holding token budgets, the most used first
// (/debug/clients).
func (p *Proxy) Clients(page, perPage int) ClientBudgets {
	return p.tbl.Load().clientBudgets(time.Now(), page, perPage, p.fleet.Load() != nil)
}

// Ready reports whether every route has a target with an endpoint that
// is in (half-open counts as ready: probes go through); notReady names
// the routes that have none. While draining it is false (see Draining).
func (p *Proxy) Ready() (ok bool, notReady []string) {
	if p.Draining() {
		return false, nil
	}
	notReady = p.tbl.Load().unready()
	return len(notReady) == 0, notReady
}

// RefreshBreakerGauges brings the gauges read on scrape up to date: the
// bytes held for clients, the client connections served lean (the lean
// server's, or every one when the server itself is lean), and every
// upstream's per-endpoint gauges.
func (p *Proxy) RefreshBreakerGauges() {
	p.m.BufferedBytes.Set(float64(p.held.used.Load()))
	lean := cmp.Or(p.leanServer(), p.server)
	p.m.LeanClientConnections.Set(float64(max(0, lean.GetOpenConnectionsCount()))) // -1 before a Serve
	p.tbl.Load().refreshGauges()
}

// Failures lists the newest failed requests (at most MaxListedFailures),
// newest first. Their slices are the ring's: read them, do not change
// them.
func (p *Proxy) Failures() []FailedRequest { return p.failures.list() }

// CloseIdleConnections closes pooled upstream connections.
func (p *Proxy) CloseIdleConnections() {
	for _, up := range p.tbl.Load().upstreams {
		up.CloseIdleConnections()
	}
}

// startUpstreams starts the background work of t's upstreams (those
// kept from the last table already run theirs) and stops that of the
// upstreams a reload left out, forgetting the series of endpoints no
// upstream has any more.
func (p *Proxy) startUpstreams(t *table, dropped []*upstream.Upstream) {
	live := map[[2]string]bool{}
	for _, up := range t.upstreams {
		up.Own()
		up.Start()
		for _, ep := range up.Endpoints() {
			live[[2]string{up.Name(), ep.Addr()}] = true
		}
	}
	for _, up := range dropped {
		up.Close()
		for _, ep := range up.Endpoints() {
			if !live[[2]string{up.Name(), ep.Addr()}] {
				p.env.Forget(up.Name(), ep)
			}
		}
	}
}

// fasthttpLogger sends fasthttp's own messages through zerolog, so a JSON
// log stays JSON. Their errors can quote what a client sent (an invalid
// header's value — an Authorization key with a stray \r — is printed
// whole), so each error is replaced by a fixed description of its kind.
type fasthttpLogger struct{ log zerolog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	for i, a := range args {
		if err, ok := a.(error); ok {
			if strings.HasPrefix(format, "error when serving connection") && answered(err) {
				return // handleParseError answered it, and logged its one line
			}
			args[i] = describe(err)
		}
	}
	l.log.Warn().Str("component", "fasthttp").Msgf(format, args...)
}

// answered reports whether a connection error is one handleParseError
// answered the client for (a request it could not read).
func answered(err error) bool {
	var small *fasthttp.ErrSmallBuffer
	return !upstream.IsTimeout(err) && !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) &&
		!errors.Is(err, net.ErrClosed) || errors.As(err, &small) || errors.Is(err, fasthttp.ErrBodyTooLarge)
}

// describe names the kind of a connection or parse error without any of
// its text, which may quote request bytes.
func describe(err error) string {
	var small *fasthttp.ErrSmallBuffer
	switch {
	case upstream.IsTimeout(err):
		return "timeout"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed by the client"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, net.ErrClosed):
		return "connection reset"
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return "request body too large"
	case errors.As(err, &small):
		return "request headers too large"
	default:
		return "malformed request (details withheld: they may quote header values)"
	}
}

// handleParseError answers requests fasthttp could not read, never
// quoting what the client sent.
func (p *Proxy) handleParseError(ctx *fasthttp.RequestCtx, err error) {
	e := newError(CodeBadRequest, "malformed HTTP request")
	var small *fasthttp.ErrSmallBuffer
	switch {
	case upstream.IsTimeout(err):
		e = newError(CodeRequestTimeout, p.limits.ReadTimeout)
	case errors.Is(err, fasthttp.ErrBodyTooLarge) && refusedForBodies(ctx, p.maxBody):
		e = bodiesFull(&p.bodies)
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		e = newError(CodeRequestTooLarge, "Sturdy", p.maxBody)
	case errors.As(err, &small):
		e = newError(CodeHeadersTooLarge, sizeText(p.limits.MaxHeaderBytes))
	}
	id := p.appendRequestID(nil)
	// fasthttp resets the header of a request it could not read: its path
	// is the one its first bytes named (over TLS, unknown: OpenAI's shape).
	api := policy.CallOf(listener.NotedPath(ctx.Conn())).API
	e.write(ctx, id, api)
	ctx.SetConnectionClose()
	p.log.Info().Bytes(fieldID, id).Str(fieldOutcome, outcomeRejected).Int(fieldStatus, e.spec.status).
		Str(fieldError, e.spec.code).Msg("request")
	p.m.Requests.WithLabelValues("", "", metrics.StatusClass(e.spec.status), outcomeRejected).Inc()
}
