package proxy

import (
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"sturdy/metrics"
	"sturdy/policy"
	"sturdy/upstream"
)

// headSize is how much of a response body Sturdy holds before committing:
// a whole small body (most JSON replies), or the first chunk of a stream.
const headSize = upstream.HeadSize

// maxLoggedRetries bounds the retries listed on an access line.
const maxLoggedRetries = 16

// maxLoggedTargets bounds the targets listed on an access line.
const maxLoggedTargets = 8

// maxTriedEndpoints bounds the endpoints a request remembers failing on
// (per target): beyond it retries may return to one.
const maxTriedEndpoints = 8

// exchange is the state of one client request that outlives an attempt,
// from arrival to the end of its response stream, in named parts: the
// client's presence, the request as it goes upstream, the attempt loop's
// counts and where it stands, the client's response, and the notes the
// access log needs. A try's own state — its reply included — is its
// attempt, a target's its visit: held here (visit, last; a
// continuation's in its stream), run by the loop's steps, not on the
// request's stack. It is
// pooled; once a reply is committed as a stream its stream (holding that
// reply) is the body reader fasthttp pulls from, and the exchange is
// released when fasthttp closes that reader.
type exchange struct {
	p   *Proxy
	tbl *table // the configuration this request started with
	ctx *fasthttp.RequestCtx
	// client is whether the client is still there, and where the request
	// stands (gone.go).
	client presence
	// held is what the request holds of the proxy's buffer budget
	// (server.max_buffered_bytes), given back when it ends.
	held share

	req   outbound
	loop  loopState
	out   response
	notes notes
	tr    *traceState // nil: the request is not traced
	// st is the client's body as it goes, once committed to go so (a
	// stream, or a body read whole for an HTTP/1.0 client): its own
	// part, with its own reader's life, pooled with the exchange.
	st *stream
	// visit, last and in are the attempt loop's (run): the target being
	// visited, the try in progress (then the last one made), and what
	// stood in the way of the targets. Held here, not on the request's
	// goroutine's stack: a stream's first event is judged at the loop's
	// deepest, and a goroutine that outgrows 8 KiB of stack keeps 16 KiB
	// for its client connection's life.
	visit visit
	last  attempt
	in    obstruction
}

// outbound is the request as Sturdy sends it upstream, and what is fixed
// about it from admission on.
type outbound struct {
	route *route
	start time.Time
	// deadline ends the wait for a response head (the route's deadline, a
	// client's timeout less policy.Margin); until ends the request, a
	// rescue included (the route's, a client's total), and is the
	// deadline from the commit on.
	deadline, until time.Time
	replayable      bool
	// call is what the request's path calls: its API (the commit point,
	// the error shape), whether it is inference, its operation's name.
	call policy.Call
	// firstToken bounds each attempt's first body byte when the request
	// asks for a stream (route first_token); 0: no such bound.
	firstToken time.Duration
	// model is the body's "model" as the client sent it, read once, in
	// place (admit): it lives as long as the request, and whatever keeps
	// it longer copies it (breaker.Group and a trace's span do).
	model string
	// priority is its class in a concurrency queue (the route's, the
	// request's own x-sturdy-priority where the route lets it say, or its
	// client key's: clientKey.classOf).
	priority upstream.Priority
	// key is its client key's settings (client_keys_file), nil when none.
	key *clientKey
	// retry is the route's retry policy, with fewer attempts per target
	// when the client is retrying on its own.
	retry   policy.Retry
	id      []byte
	uri     []byte
	body    []byte // a rewritten body (model changed for a target)
	scratch []byte // for header values built per request
	// holds are the token reservations it holds (tokens.go), settled or
	// refunded as it ends; metered says its reply's usage is read as it
	// is relayed (a budget or a trace needs it: meter.go).
	holds   []tokenHold
	metered bool
	// wantsUsage: a stream whose client did not ask for its usage, and a
	// budget needs it (needUsage).
	wantsUsage bool
	// spenders are the spend budgets it was admitted under (spend.go).
	spenders []spender
	// bodyHeld is what its body holds of server.max_request_bytes.
	bodyHeld int
	// est is what it reserves of a token budget, once estimated.
	est       tokenEstimate
	estimated bool
	// msg is the upstream request; it lives as long as the pooled
	// exchange.
	msg *fasthttp.Request
}

// loopState is where the attempt loop stands: the current target, the
// attempts so far, and why it stopped.
//
// What the loop learns on one target is not here: it lives in that
// target's visit (loop.go; the exchange's visit field); what stood in the
// way of the targets is the loop's obstruction, carried from visit to
// visit and handed to respond.
type loopState struct {
	// ti is the index in route.targets of the current target (the first
	// that serves the request's API until the loop uses one; the
	// answering one once committed): see exchange.target.
	ti       int
	attempts int // across all targets, stale replays included
	// replays counts the stale replays, rides the ride-through probes
	// that could not connect: max_total_attempts counts neither
	// (counted).
	rides, replays int
	// slot, entered and rider are what the request holds of the current
	// target until it leaves it (leaveTarget): whose max_in_flight slot,
	// whose in-flight count, whose riders' place (ride_through).
	slot, entered, rider *upstream.Upstream
	// ep is the endpoint of the current (or last) attempt.
	ep   *upstream.Endpoint
	stop policy.Stop
	// lastStatus is the status of the last attempt (0: it produced
	// none), for an error's details.
	lastStatus int
}

// leaveTarget gives back what the request holds of the current target.
func (lp *loopState) leaveTarget() {
	lp.stopRiding()
	if lp.slot != nil {
		lp.slot.FreeSlot()
		lp.slot = nil
	}
	if lp.entered != nil {
		lp.entered.Leave()
		lp.entered = nil
	}
}

// stopRiding gives back the ride-through queue place, if one is held.
func (lp *loopState) stopRiding() {
	if up := lp.rider; up != nil {
		up.FreeRider()
		lp.rider = nil
	}
}

// report is where this request's steps report what happened (summary.go).
func (ex *exchange) report() report {
	r := report{n: &ex.notes, m: ex.p.m, tr: ex.tr}
	if ex.req.route != nil {
		r.route = ex.req.route.name
	}
	return r
}

// target is the request's current target (loopState.ti), nil before it
// is routed.
func (ex *exchange) target() *target {
	if ex.req.route == nil {
		return nil
	}
	return &ex.req.route.targets[ex.loop.ti]
}

// ownCooldown is a cooldown a request's own 429 started with its server's
// wait: the request waits that wait and retries, past the extension the
// jitter added for everyone else (see gate).
type ownCooldown struct {
	up    *upstream.Upstream
	until time.Time // the cooldown's end as set
}

// response is what the client gets: the status and outcome, and for a
// stream what its reader needs.
type response struct {
	status  int
	outcome string
	errCode string
	// cause is what a breaker or a connection failure said, for an
	// upstream_error or circuit_open answer (the summary's).
	cause string
	// streaming says the reply streams (relayed as it comes); reader that
	// the exchange's stream is the client's body reader, ended by
	// CloseWithError (a stream, or a body read whole for an HTTP/1.0
	// client).
	streaming, reader bool
	// ttfb is until the answering attempt's response head arrived; ttft
	// until the client's response started (a stream's commit point, its
	// first output).
	ttfb, ttft time.Duration
	bytesOut   int64
	// ended says finish began: a panic past it does not run it again
	// (survive).
	ended bool
}

// notes are what the access line lists: each retry and each target,
// and the waits.
type notes struct {
	retries  [maxLoggedRetries]retryNote
	nRetries int
	tried    [maxLoggedTargets]targetNote
	nTried   int
	// waits is the time waited, by who set it (the access line's waits).
	waits waits
}

// obstacle is a reason no attempt could be made on a target.
type obstacle struct {
	kind     policy.Obstacle
	upstream string
	wait     time.Duration // until it clears, as far as known
	limit    string        // the setting a busy upstream is at; the breaker that refused
	model    string        // the model a model breaker refused
	cause    string        // what put the endpoints out (a breaker's Cause, a health check)
}

// retryNote is one retry as logged: why, after a failure on which
// endpoint, and how long Sturdy waited.
type retryNote struct {
	reason   policy.Reason
	endpoint string
	wait     time.Duration
}

// targetNote is one target as logged: which, with what model, how many
// attempts, and how its last attempt (or obstacle) ended.
type targetNote struct {
	upstream string
	model    string
	endpoint string // of its last attempt
	attempts int
	replays  int // of them, stale resends
	result   string
	breaker  string // which breaker refused it (connection, model), if one did
}

var exchangePool = sync.Pool{New: func() any {
	ex := &exchange{client: presence{goneCh: make(chan struct{})}, req: outbound{msg: new(fasthttp.Request)},
		st: new(stream)}
	ex.st.ex = ex
	return ex
}}

// finish logs and measures the request and returns the exchange to the
// pool.
func (ex *exchange) finish() {
	ex.out.ended = true
	if cc := ex.client.cc; cc != nil {
		cc.Serving(nil)
	}
	ex.loop.leaveTarget()
	var s summary
	s.read(ex)
	s.logAccess(&ex.p.log)
	ex.tr.end(&s, ex.st.broken)
	s.measure(ex.p.m)
	ex.p.failures.record(&s)
	settle(ex, &s)
	ex.tr.release()
	ex.st.rp.release() // the reply it streamed, if it was committed to go as it comes
	ex.p.held.give(ex.held.n)
	ex.p.bodies.give(ex.req.bodyHeld)
	ex.req.msg.Reset()
	gone := ex.client.goneCh
	if ex.client.isGone.Load() {
		gone = make(chan struct{}) // a closed one cannot be reused
	}
	st, metered := ex.st, ex.st.meter.pending
	*st = stream{ex: ex}
	if cap(metered) <= 2*meterHold {
		st.meter.pending = metered[:0] // a meter's buffer, unless a large read grew it
	}
	*ex = exchange{
		st:     st,
		client: presence{goneCh: gone},
		req: outbound{msg: ex.req.msg, id: ex.req.id[:0], uri: ex.req.uri[:0], body: ex.req.body[:0],
			scratch: ex.req.scratch[:0], holds: ex.req.holds[:0], spenders: ex.req.spenders[:0]},
	}
	exchangePool.Put(ex)
}

// measure records the finished request in the metrics m (and its
// route's series, bound once per configuration).
func (s *summary) measure(m *metrics.Metrics) {
	if s.answered != nil && s.outcome == outcomeOK && s.status/100 == 2 {
		s.answered.answered.Inc() // the common series, without hashing its labels
	} else {
		m.Requests.WithLabelValues(s.route, s.upstream, metrics.StatusClass(s.status), s.outcome).Inc()
	}
	if s.outcome == outcomeClientGone {
		m.ClientGone.WithLabelValues(s.gonePhase.String()).Inc()
	}
	if s.stop.Ended() {
		m.GiveUps.WithLabelValues(s.upstream, s.stop.String()).Inc()
	}
	if u := s.usage; u.Known {
		m.Tokens.WithLabelValues(s.route, s.upstream, s.model, "input").Add(float64(u.Input))
		m.Tokens.WithLabelValues(s.route, s.upstream, s.model, "output").Add(float64(u.Output))
	}
	if s.cost > 0 {
		m.Spend.WithLabelValues(s.route, s.upstream, s.model).Add(s.cost)
	}
	if r := s.rt; r != nil {
		r.ttfb.Observe(s.ttft.Seconds())
		dur := r.durPlain
		if s.streaming {
			dur = r.durStream
			m.OpenStreams.Dec()
		}
		dur.Observe(s.dur.Seconds())
	}
	m.InFlight.Dec()
}

// responseCap is when the response must have ended (zero: never): the
// route's max_duration from the request's start — by default 10 minutes
// for a non-streamed reply (known length, not SSE or NDJSON) and none for
// a stream (streamed: chunked, or SSE or NDJSON).
func (q *outbound) responseCap(streamed bool) time.Time {
	d := q.route.maxDuration
	if d <= 0 {
		if streamed {
			return time.Time{}
		}
		d = DefaultMaxDuration
	}
	return q.start.Add(d)
}
