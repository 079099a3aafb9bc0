package proxy

import (
	"context"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"sturdy/policy"
	"sturdy/tracing"
	"sturdy/upstream"
)

// Tracing traces every request with OpenTelemetry: a server span per
// request, a client span per attempt, W3C trace context continued from
// the client and sent upstream per attempt.
type Tracing struct {
	tracing.Settings
	// Version is the service.version spans carry.
	Version string
}

// Attribute names: OpenTelemetry's HTTP and GenAI semantic conventions,
// and Sturdy's own under sturdy.*.
const (
	attrMethod        = attribute.Key("http.request.method")
	attrStatus        = attribute.Key("http.response.status_code")
	attrRoute         = attribute.Key("http.route")
	attrResend        = attribute.Key("http.request.resend_count")
	attrBodySize      = attribute.Key("http.response.body.size")
	attrURLPath       = attribute.Key("url.path")
	attrURLScheme     = attribute.Key("url.scheme")
	attrURLFull       = attribute.Key("url.full")
	attrServerAddr    = attribute.Key("server.address")
	attrServerPort    = attribute.Key("server.port")
	attrClientAddr    = attribute.Key("client.address")
	attrUserAgent     = attribute.Key("user_agent.original")
	attrProtoVersion  = attribute.Key("network.protocol.version")
	attrErrorType     = attribute.Key("error.type")
	attrOperation     = attribute.Key("gen_ai.operation.name")
	attrProvider      = attribute.Key("gen_ai.provider.name")
	attrRequestModel  = attribute.Key("gen_ai.request.model")
	attrResponseModel = attribute.Key("gen_ai.response.model")
	attrInputTokens   = attribute.Key("gen_ai.usage.input_tokens")
	attrOutputTokens  = attribute.Key("gen_ai.usage.output_tokens")
	attrRequestID     = attribute.Key("sturdy.request_id")
	attrSturdyRoute   = attribute.Key("sturdy.route")
	attrUpstream      = attribute.Key("sturdy.upstream")
	attrEndpoint      = attribute.Key("sturdy.endpoint")
	attrOutcome       = attribute.Key("sturdy.outcome")
	attrAttempts      = attribute.Key("sturdy.attempts")
	attrAttempt       = attribute.Key("sturdy.attempt")
	attrStop          = attribute.Key("sturdy.stop")
	attrErrorCode     = attribute.Key("sturdy.error")
	attrStream        = attribute.Key("sturdy.stream")
	attrTTFB          = attribute.Key("sturdy.ttfb_ms")
	attrTTFT          = attribute.Key("sturdy.ttft_ms")
	attrResult        = attribute.Key("sturdy.result")
	attrRetryReason   = attribute.Key("sturdy.retry_reason")
	attrDecision      = attribute.Key("sturdy.decision")
	attrConnBreaker   = attribute.Key("sturdy.breaker.connection")
	attrModelBreaker  = attribute.Key("sturdy.breaker.model")
	attrCause         = attribute.Key("sturdy.cause")
	attrStaleReplay   = attribute.Key("sturdy.stale_replay")
	attrContinuation  = attribute.Key("sturdy.continuation")
	attrRescued       = attribute.Key("sturdy.rescued")
	attrWaitMS        = attribute.Key("sturdy.wait.ms")
	attrWaitSource    = attribute.Key("sturdy.wait.source")
	attrPhase         = attribute.Key("sturdy.phase")
	attrRescueResult  = attribute.Key("sturdy.rescue.result")
)

// waitSource is who set a wait: a trace's sturdy.wait.source, the
// access line's waits.
type waitSource uint8

// The sources of a wait.
const (
	sourceSturdy      waitSource = iota // Sturdy's own backoff
	sourceServer                        // the upstream's Retry-After / retry-after-ms
	sourceCooldown                      // a cooldown learned from an earlier reply (here or in the fleet)
	sourceRateLimit                     // the upstream's rate_limit, this replica's
	sourceFleetLimit                    // the upstream's rate_limit, the fleet's (Redis)
	sourceInFlight                      // a max_in_flight slot
	sourceConnections                   // a connection place
	sourceConcurrency                   // a place under an endpoint's concurrency limit
	sourceRideThrough                   // an endpoint to come back
	waitSources                         // how many
)

var waitSourceNames = [waitSources]string{"sturdy", "server", "cooldown", "rate_limit", "fleet_limit", "max_in_flight",
	"max_connections", "concurrency", "ride_through"}

func (s waitSource) String() string { return waitSourceNames[s] }

// traceState is an exchange's part in a trace; span nil: not traced, and
// every hook returns at once. A span that is not sampled (rec false)
// still gives each attempt its traceparent, and nothing more is done.
type traceState struct {
	t   *tracing.Tracer
	rec bool
	// ctx carries the server span, the attempts' parent.
	ctx  context.Context
	span trace.Span
	// attempt is the attempt in progress, or the one whose reply goes to
	// the client (ended with the request).
	attempt trace.Span
	// attrs and attemptAttrs gather the server span's and the attempt's
	// attributes, set once as each span ends (one copy into the span).
	attrs, attemptAttrs []attribute.KeyValue
	// model is the request's model, copied once for every span that
	// names it (the request's is read in place from the body).
	model string
}

// maxSpanText bounds a span attribute (or name part) copied from a
// request: a span lives in the export queue (2,048 of them) until it is
// sent, so what a client sends must not be copied onto it whole. The
// SDK's own value-length limit (tracing.MaxAttributeBytes, the same) is
// the backstop, but it keeps a substring of the whole copy.
const maxSpanText = tracing.MaxAttributeBytes

// spanText copies at most maxSpanText bytes of b for a span, cut where a
// character starts.
func spanText(b []byte) string { return string(b[:policy.RuneCut(b, maxSpanText)]) }

// propagator reads and writes W3C traceparent and tracestate.
var propagator = propagation.TraceContext{}

// headerCarrier lets the propagator read a client's request headers and
// write an upstream request's.
type headerCarrier struct{ h *fasthttp.RequestHeader }

func (c headerCarrier) Get(k string) string { return string(c.h.Peek(k)) }
func (c headerCarrier) Set(k, v string)     { c.h.Set(k, v) }
func (c headerCarrier) Keys() []string      { return propagator.Fields() }

// tracer is the running tracer, with what it was started with.
type tracer struct {
	opts Tracing
	t    *tracing.Tracer
}

// retireAfter is how long a tracer a reload replaced keeps exporting the
// spans of requests that started with it.
const retireAfter = time.Minute

// tracers are the proxy's tracers: the current one (cur, nil: tracing
// off) and those a reload replaced, not yet stopped (retired).
type tracers struct {
	cur     atomic.Pointer[tracer]
	mu      sync.Mutex
	retired map[*tracing.Tracer]struct{}
}

// start starts tracing when o asks for it and makes it the current
// tracer; the tracer it replaces exports its requests' spans for
// retireAfter more, then stops. A reload that keeps the settings keeps
// the tracer.
func (ts *tracers) start(o *Tracing, log *zerolog.Logger) error {
	old := ts.cur.Load()
	switch {
	case o == nil && old == nil:
		return nil
	case o != nil && old != nil && reflect.DeepEqual(*o, old.opts): // tracing.Resolve gives headers: {} as nil
		return nil
	}
	var next *tracer
	if o != nil {
		t, err := tracing.New(o.Settings, o.Version)
		if err != nil {
			return err
		}
		next = &tracer{opts: *o, t: t}
	}
	ts.cur.Store(next)
	if old != nil {
		ts.retire(old.t)
	}
	if next == nil {
		log.Info().Msg("tracing off")
	} else {
		log.Info().Str("exporter", next.opts.Protocol).Str("endpoint", next.opts.URL).
			Float64("sample_ratio", next.opts.SampleRatio).Str("service_name", next.opts.ServiceName).Msg("tracing on")
	}
	return nil
}

// retire stops t after retireAfter (or at Shutdown, if sooner).
func (ts *tracers) retire(t *tracing.Tracer) {
	ts.mu.Lock()
	if ts.retired == nil {
		ts.retired = map[*tracing.Tracer]struct{}{}
	}
	ts.retired[t] = struct{}{}
	ts.mu.Unlock()
	time.AfterFunc(retireAfter, func() {
		ts.mu.Lock()
		_, ok := ts.retired[t]
		delete(ts.retired, t)
		ts.mu.Unlock()
		if ok {
			ctx, cancel := context.WithTimeout(context.Background(), traceFlushTimeout)
			defer cancel()
			_ = t.Shutdown(ctx)
		}
	})
}

// traceFlushTimeout bounds exporting the last spans at shutdown.
const traceFlushTimeout = 5 * time.Second

// stop exports the spans not yet exported, of every tracer, and stops
// them (Shutdown, once requests are done).
func (ts *tracers) stop(log *zerolog.Logger) {
	all := []*tracing.Tracer{}
	if cur := ts.cur.Load(); cur != nil {
		all = append(all, cur.t)
	}
	ts.mu.Lock()
	for t := range ts.retired {
		all = append(all, t)
	}
	clear(ts.retired)
	ts.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), traceFlushTimeout)
	defer cancel()
	for _, t := range all {
		if err := t.Shutdown(ctx); err != nil {
			log.Warn().Err(err).Msg("tracing: spans not all exported at shutdown")
		}
	}
}

// tracePool keeps the traced requests' states (their buffers with them).
var tracePool = sync.Pool{New: func() any { return new(traceState) }}

// startTrace is the trace state of a request when tracing is on (t set):
// its server span started (start); nil otherwise, and every traceState
// method is then a no-op.
func startTrace(t *tracer, ctx *fasthttp.RequestCtx, id []byte, at time.Time) *traceState {
	if t == nil {
		return nil
	}
	tr := tracePool.Get().(*traceState)
	tr.start(t, ctx, id, at)
	return tr
}

// release gives tr back to the pool, emptied, its buffers kept.
func (tr *traceState) release() {
	if tr == nil {
		return
	}
	*tr = traceState{attrs: tr.attrs[:0], attemptAttrs: tr.attemptAttrs[:0]}
	tracePool.Put(tr)
}

// start starts the request's server span with tracer t (nil: tracing
// off), continuing the client's trace when its traceparent says so; id is
// the request's, at when it arrived.
func (tr *traceState) start(t *tracer, ctx *fasthttp.RequestCtx, id []byte, at time.Time) {
	rh := &ctx.Request.Header
	parent := propagator.Extract(context.Background(), headerCarrier{rh})
	tr.t = t.t
	method := spanText(ctx.Method())
	tr.ctx, tr.span = t.t.Tracer().Start(parent, method, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(at))
	if tr.rec = tr.span.IsRecording(); !tr.rec {
		return
	}
	scheme := "http"
	if ctx.IsTLS() {
		scheme = "https"
	}
	host, port := upstream.SplitHostPort(spanText(rh.Host()), scheme)
	attrs := append(tr.attrs[:0],
		attrMethod.String(method),
		attrURLPath.String(spanText(rawPath(rh.RequestURI()))),
		attrURLScheme.String(scheme),
		attrServerAddr.String(host),
		attrClientAddr.String(ctx.RemoteIP().String()),
		attrProtoVersion.String(protoVersion(rh.IsHTTP11())),
		attrRequestID.String(string(id)),
	)
	if port > 0 {
		attrs = append(attrs, attrServerPort.Int(port))
	}
	if ua := rh.UserAgent(); len(ua) > 0 {
		attrs = append(attrs, attrUserAgent.String(spanText(ua)))
	}
	tr.attrs = attrs
}

func protoVersion(http11 bool) string {
	if http11 {
		return "1.1"
	}
	return "1.0"
}

// providerOf is gen_ai.provider.name of a request's API: the format it
// speaks (no name for Ollama's own; gen_ai.system is deprecated).
func providerOf(api policy.API) string {
	switch api {
	case policy.APIAnthropic:
		return "anthropic"
	case policy.APIChat, policy.APICompletions, policy.APIResponses, policy.APIOther:
		return "openai"
	}
	return ""
}

// route names the server span for the route r the request took and
// notes the model it asked for (the request's, read in place).
func (tr *traceState) route(method []byte, r *route, call policy.Call, model string) {
	if tr == nil { // the request is not traced
		return
	}
	s := tr.span
	if !tr.rec {
		return
	}
	s.SetName(spanText(method) + " " + string(r.prefix))
	attrs := append(tr.attrs, attrRoute.String(string(r.prefix)), attrSturdyRoute.String(r.name))
	if call.Operation != "" {
		attrs = append(attrs, attrOperation.String(call.Operation))
	}
	if p := providerOf(call.API); p != "" {
		attrs = append(attrs, attrProvider.String(p))
	}
	if model != "" {
		tr.model = strings.Clone(model) // policy.ModelKey's: at most 256 bytes
		attrs = append(attrs, attrRequestModel.String(tr.model))
	}
	tr.attrs = attrs
}

// startAttempt starts attempt a's client span under the request's and
// puts its traceparent (and the client's tracestate) on the upstream
// request q, so the model server's spans hang under this attempt. method
// is the client's; a stale connection's replay (a.stale) is marked
// sturdy.stale_replay.
func (tr *traceState) startAttempt(q *outbound, method []byte, a *attempt) {
	if tr == nil { // the request is not traced
		return
	}
	up := a.up.Name()
	tr.endAttempt()
	h := &q.msg.Header
	h.Del("tracestate") // the client's, copied with its headers: Inject sends it again if its traceparent was valid
	if !tr.rec {
		ctx, s := tr.t.Tracer().Start(tr.ctx, "attempt", trace.WithSpanKind(trace.SpanKindClient))
		propagator.Inject(ctx, headerCarrier{h})
		tr.attempt = s
		return
	}
	server, port := a.ep.Server()
	attrs := append(tr.attemptAttrs[:0],
		attrMethod.String(spanText(method)),
		attrServerAddr.String(server), attrServerPort.Int(port),
		// The URI aim wrote, without the query: no secret rides in a span.
		attrURLFull.String(spanText(rawPath(q.uri))),
		attrUpstream.String(up),
		attrAttempt.Int(a.n),
	)
	switch m := a.model; {
	case m == q.model && m != "":
		attrs = append(attrs, attrRequestModel.String(tr.model)) // copied once
	case m != "":
		attrs = append(attrs, attrRequestModel.String(m)) // a target's model: the config's string
	}
	if a.n > 1 {
		attrs = append(attrs, attrResend.Int(a.n-1))
	}
	if a.stale {
		attrs = append(attrs, attrStaleReplay.Bool(true))
	}
	if a.cont {
		attrs = append(attrs, attrContinuation.Bool(true))
	}
	ctx, s := tr.t.Tracer().Start(tr.ctx, spanText(method)+" "+up, trace.WithSpanKind(trace.SpanKindClient))
	propagator.Inject(ctx, headerCarrier{h})
	tr.attempt, tr.attemptAttrs = s, attrs
}

// attemptDone records how attempt a went: its status or fault, its
// result and the breakers' states after it.
func (tr *traceState) attemptDone(a *attempt) {
	if tr == nil { // the request is not traced
		return
	}
	s := tr.attempt
	if s == nil || !tr.rec {
		return
	}
	v, out := a.verdict, &a.out
	attrs := append(tr.attemptAttrs,
		attrResult.String(v.Label()),
		attrConnBreaker.String(a.ep.Breaker().State().String()),
		attrModelBreaker.String(a.ep.ModelBreakerState(a.model)),
	)
	errType := ""
	if out.Fault == policy.FaultNone {
		attrs = append(attrs, attrStatus.Int(out.Status))
		if out.Status >= 400 {
			errType = strconv.Itoa(out.Status)
		}
	} else {
		errType = out.Fault.String()
		if a.why != "" && out.Fault == policy.FaultConnect {
			attrs = append(attrs, attrCause.String(a.why))
		}
	}
	if v.Class == policy.ClassRetryable {
		attrs = append(attrs, attrRetryReason.String(v.Reason.String()))
		if out.StreamFailed && errType == "" {
			errType = "stream_error"
		}
	}
	if errType != "" {
		attrs = append(attrs, attrErrorType.String(errType))
		if v.Class != policy.ClassClientGone { // abandoned for the client, not failed
			s.SetStatus(codes.Error, v.Label())
		}
	}
	tr.attemptAttrs = attrs
}

// attemptDecided records what policy chose after the attempt; the
// attempt's span ends unless its reply may be the client's.
func (tr *traceState) attemptDecided(d policy.Decision) {
	if tr == nil { // the request is not traced
		return
	}
	if tr.attempt == nil {
		return
	}
	if tr.rec {
		decision := "retry"
		if d.Action != policy.ActionAttempt {
			decision = d.Action.String()
		}
		tr.attemptAttrs = append(tr.attemptAttrs, attrDecision.String(decision))
	}
	if d.Action != policy.ActionStop {
		tr.endAttempt()
	}
}

// attemptCut marks the attempt whose stream failed mid-answer (err says
// how, if known) and ends its span.
func (tr *traceState) attemptCut(err error) {
	if tr == nil { // the request is not traced
		return
	}
	s := tr.attempt
	if s == nil || !tr.rec {
		tr.endAttempt()
		return
	}
	tr.attemptAttrs = append(tr.attemptAttrs, attrErrorType.String("stream_interrupted"))
	msg := "the stream failed mid-response"
	if err != nil {
		msg += ": " + err.Error()
	}
	s.SetStatus(codes.Error, msg)
	tr.endAttempt()
}

// endAttempt ends the attempt's span, if one is open.
func (tr *traceState) endAttempt() {
	if tr == nil { // the request is not traced
		return
	}
	if s := tr.attempt; s != nil {
		s.SetAttributes(tr.attemptAttrs...)
		s.End()
		tr.attempt, tr.attemptAttrs = nil, tr.attemptAttrs[:0]
	}
}

// wait notes a wait of d on the request's span, named for the phase it
// is in (backoff, retry_after, cooldown, pacing, queue, ride_through),
// with who set it.
func (tr *traceState) wait(in phase, d time.Duration, source waitSource) {
	if tr == nil { // the request is not traced
		return
	}
	if !tr.rec || d <= 0 {
		return
	}
	tr.span.AddEvent(in.String(), trace.WithAttributes(
		attrWaitMS.Float64(float64(d)/float64(time.Millisecond)), attrWaitSource.String(source.String())))
}

// queued notes a queue wait of d that began at start.
func (tr *traceState) queued(start time.Time, d time.Duration, source waitSource) {
	if tr == nil { // the request is not traced
		return
	}
	if !tr.rec {
		return
	}
	tr.span.AddEvent(phaseQueue.String(), trace.WithTimestamp(start), trace.WithAttributes(
		attrWaitMS.Float64(float64(d)/float64(time.Millisecond)), attrWaitSource.String(source.String())))
}

// committed notes the moment the reply went to the client (at: its ttft)
// and whether it streams.
func (tr *traceState) committed(at time.Time, streaming bool) {
	if tr == nil { // the request is not traced
		return
	}
	if !tr.rec {
		return
	}
	tr.span.AddEvent("commit", trace.WithTimestamp(at), trace.WithAttributes(attrStream.Bool(streaming)))
}

// rescueResult notes a rescue of a stream cut mid-answer: continued,
// failed, or why none was tried.
func (tr *traceState) rescueResult(result string) {
	if tr == nil { // the request is not traced
		return
	}
	if !tr.rec {
		return
	}
	tr.span.AddEvent("rescue", trace.WithAttributes(attrRescueResult.String(result)))
}

// end ends the request's spans with how it went, from its summary;
// broken is why its stream failed mid-body, if it did.
func (tr *traceState) end(sm *summary, broken error) {
	if tr == nil { // the request is not traced
		return
	}
	s := tr.span
	if !tr.rec {
		tr.endAttempt()
		s.End()
		return
	}
	if broken != nil {
		tr.attemptCut(broken)
	}
	tr.endAttempt()
	if sm.outcome == outcomeClientGone {
		s.AddEvent("client_gone", trace.WithAttributes(attrPhase.String(sm.gonePhase.String())))
	}
	attrs := sm.spanAttrs(tr.attrs)
	if sm.status >= 500 || sm.outcome == outcomeStreamInterrupted {
		t := sm.errCode
		if t == "" {
			t = sm.outcome
		}
		attrs = append(attrs, attrErrorType.String(t))
		s.SetStatus(codes.Error, sm.outcome)
	}
	s.SetAttributes(attrs...)
	s.End()
	tr.attrs = attrs
}

// spanAttrs appends the server span's attributes of the request's end to
// attrs: status, outcome, where it went, its stop and error, its timings,
// its rescue and the answer's usage.
func (sm *summary) spanAttrs(attrs []attribute.KeyValue) []attribute.KeyValue {
	attrs = append(attrs,
		attrStatus.Int(sm.status),
		attrOutcome.String(sm.outcome),
		attrAttempts.Int(sm.attempts),
		attrBodySize.Int64(sm.bytesOut),
		attrStream.Bool(sm.streaming),
	)
	if sm.rt != nil {
		attrs = append(attrs, attrUpstream.String(sm.upstream))
		if sm.endpoint != "" {
			attrs = append(attrs, attrEndpoint.String(sm.endpoint))
		}
	}
	if sm.stop.Ended() {
		attrs = append(attrs, attrStop.String(sm.stop.String()))
	}
	if sm.errCode != "" {
		attrs = append(attrs, attrErrorCode.String(sm.errCode))
	}
	if sm.ttfb > 0 {
		attrs = append(attrs, attrTTFB.Float64(float64(sm.ttfb)/float64(time.Millisecond)))
	}
	if sm.ttft > 0 {
		attrs = append(attrs, attrTTFT.Float64(float64(sm.ttft)/float64(time.Millisecond)))
	}
	if sm.rescued > 0 {
		attrs = append(attrs, attrRescued.Int(sm.rescued))
	}
	if u := sm.usage; u.model != "" || u.Known {
		if u.model != "" {
			// A copy of its key alone: gjson's string shares the body's copy.
			attrs = append(attrs, attrResponseModel.String(strings.Clone(policy.ModelKey(u.model))))
		}
		if u.Known {
			attrs = append(attrs, attrInputTokens.Int64(u.Input), attrOutputTokens.Int64(u.Output))
		}
	}
	return attrs
}

// traceID is the request's trace id, for the access line; false: not
// traced.
func (tr *traceState) traceID() (trace.TraceID, bool) {
	if tr == nil {
		return trace.TraceID{}, false
	}
	return tr.span.SpanContext().TraceID(), true
}
