package proxy

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"sturdy/breaker"
	"sturdy/metrics"
	"sturdy/policy"
)

// headSize is how much of a response body Sturdy holds before committing:
// a whole small body (most JSON replies), or the first chunk of a stream.
const headSize = 32 << 10

// maxLoggedRetries bounds the retries listed on an access line.
const maxLoggedRetries = 16

// retryNote is one retry as logged: why, and how long Sturdy waited.
type retryNote struct {
	reason policy.Reason
	wait   time.Duration
}

// Stream kinds decide how a failed stream is ended for the client.
type streamKind uint8

const (
	streamOther  streamKind = iota // abort the connection
	streamSSE                      // final data: {"error":...} event
	streamNDJSON                   // final {"error":"..."} line
)

// exchange is the state of one client request, from arrival to the end of
// its response stream. It is pooled; once a reply is committed as a stream
// it is the body reader fasthttp pulls from, and it is released when
// fasthttp closes that reader.
type exchange struct {
	p     *Proxy
	tbl   *table // the configuration this request started with
	ctx   *fasthttp.RequestCtx
	route *route
	up    *upstream

	start      time.Time
	deadline   time.Time
	replayable bool
	id         []byte
	uri        []byte

	// req and resp live as long as the pooled exchange.
	req  *fasthttp.Request
	resp *fasthttp.Response
	// body is the upstream response stream still to be read, nil once
	// fully read or closed.
	body io.Reader
	// head holds the body bytes read before commit; headOff is how much
	// of it went to the client.
	head    []byte
	headOff int

	attempts int
	retries  [maxLoggedRetries]retryNote
	nRetries int
	hasReply bool // the last attempt produced a status (no fault)
	verdict  policy.Verdict
	fault    policy.Fault
	stop     policy.Stop

	// Response side.
	status    int
	outcome   string
	errCode   string
	streaming bool
	kind      streamKind
	chunked   bool
	ttfb      time.Duration
	bytesOut  int64
	lastByte  [2]byte
	pending   error  // upstream error seen with data, reported on next Read
	tail      []byte // final error event for an interrupted stream
	broken    error  // why the upstream stream failed mid-body
}

var exchangePool = sync.Pool{New: func() any {
	return &exchange{head: make([]byte, 0, headSize), req: new(fasthttp.Request), resp: new(fasthttp.Response)}
}}

// Handle serves one client request.
func (p *Proxy) Handle(ctx *fasthttp.RequestCtx) {
	ex := exchangePool.Get().(*exchange)
	ex.p, ex.ctx, ex.start, ex.tbl = p, ctx, time.Now(), p.tbl.Load()
	p.m.InFlight.Inc()
	ex.id = ex.requestID(ex.id[:0])
	if !ex.admit() {
		ex.finish()
		return
	}
	ex.prepare()
	ex.run()
	if !ex.streaming {
		ex.finish()
	}
}

// requestID takes the client's X-Request-Id when sane, else makes one.
func (ex *exchange) requestID(dst []byte) []byte {
	if v := ex.ctx.Request.Header.PeekBytes(hdrRequestID); len(v) > 0 && len(v) <= 128 && printable(v) {
		return append(dst, v...)
	}
	return ex.p.appendRequestID(dst)
}

func printable(b []byte) bool {
	for _, c := range b {
		if c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

// admit refuses what Sturdy will not forward: proxy requests (CONNECT,
// absolute URIs), paths no route serves, bodies over the route's max.
func (ex *exchange) admit() bool {
	ctx := ex.ctx
	uri := ctx.Request.Header.RequestURI()
	if ctx.IsConnect() || len(uri) == 0 || uri[0] != '/' {
		ex.reject(400, CodeBadRequest, "Sturdy is a reverse proxy, not an open proxy: send origin-form requests (a path like /v1/chat/completions), not CONNECT or absolute URIs")
		return false
	}
	ex.route = ex.tbl.match(rawPath(uri))
	if ex.route == nil {
		ex.reject(404, CodeBadRequest, fmt.Sprintf("no route serves path %q; configure a route whose path_prefix matches it", rawPath(uri)))
		return false
	}
	ex.up = ex.route.upstream
	ex.up.inFlight.Add(1)
	if n := len(ctx.Request.Body()); n > ex.route.maxBody {
		ex.reject(413, CodeRequestTooLarge, fmt.Sprintf("request body of %d bytes is larger than route %q accepts (%d bytes); send a smaller request", n, ex.route.name, ex.route.maxBody))
		return false
	}
	return true
}

func (ex *exchange) reject(status int, code, msg string) {
	ex.outcome = "rejected"
	ex.fail(status, code, msg, 0)
}

// rawPath is the request URI up to the query, as received.
func rawPath(uri []byte) []byte {
	if i := bytes.IndexByte(uri, '?'); i >= 0 {
		return uri[:i]
	}
	return uri
}

// prepare builds the upstream request once; every attempt replays it.
func (ex *exchange) prepare() {
	ctx, req := ex.ctx, ex.req
	ex.deadline = ex.start.Add(ex.route.deadline)
	ex.replayable = policy.Replayable(ctx.Method(), rawPath(ctx.Request.Header.RequestURI()),
		len(ctx.Request.Header.PeekBytes(hdrIdempotencyKey)) > 0)

	ctx.Request.Header.CopyTo(&req.Header)
	dropHopHeaders(&req.Header)
	// The body is already read whole: a 100-continue handshake upstream
	// would only add a round trip.
	req.Header.DelBytes(hdrExpect)
	req.Header.ResetConnectionClose()
	req.Header.SetNoDefaultContentType(true)
	ex.uri = append(append(ex.uri[:0], ex.up.base...), ctx.Request.Header.RequestURI()...)
	req.SetRequestURIBytes(ex.uri)
	req.SetBodyRaw(ctx.Request.Body())
	req.Header.SetBytesKV(hdrRequestID, ex.id)
	if ex.up.auth != nil {
		req.Header.SetBytesKV(hdrAuthorization, ex.up.auth)
	}
	ip := ctx.RemoteIP().String()
	if prior := req.Header.PeekBytes(hdrForwardedFor); len(prior) > 0 {
		ip = string(prior) + ", " + ip
	}
	req.Header.SetBytesK(hdrForwardedFor, ip)
}

// run is the attempt loop: it owns "try again?" and the wait, and ends
// with the client's response committed (or written).
func (ex *exchange) run() {
	for {
		done, ok := ex.up.breaker.Allow()
		if !ok {
			if ex.attempts == 0 || !ex.hasReply {
				ex.circuitOpen()
				return
			}
			ex.stop = policy.StopBreakerOpen
			ex.giveUp()
			return
		}
		ex.closeBody()
		ex.attempts++
		out := ex.attempt()
		ex.verdict = policy.Classify(out)
		done(breakerResult(ex.verdict.Health))
		ex.p.m.Attempts.WithLabelValues(ex.up.name, resultLabel(ex.verdict)).Inc()
		ex.fault, ex.hasReply = out.Fault, out.Fault == policy.FaultNone

		a := policy.Attempt{Verdict: ex.verdict, N: ex.attempts, Replayable: ex.replayable,
			Remaining: time.Until(ex.deadline)}
		if ex.hasReply && ex.verdict.Class == policy.ClassRetryable {
			a.ServerWait, a.HasServerWait = policy.RetryAfter(ex.resp.Header.PeekBytes(hdrRetryAfterMS),
				ex.resp.Header.PeekBytes(hdrRetryAfter), time.Now())
		}
		step := ex.route.retry.Next(a, ex.p.rand)
		if !step.Retry {
			ex.stop = step.Stop
			ex.conclude()
			return
		}
		ex.p.m.Retries.WithLabelValues(ex.up.name, ex.verdict.Reason.String()).Inc()
		source := "backoff"
		if step.FromServer {
			source = "server"
		}
		ex.p.m.RetryWait.WithLabelValues(ex.up.name, source).Observe(step.Wait.Seconds())
		if ex.nRetries < maxLoggedRetries {
			ex.retries[ex.nRetries] = retryNote{reason: ex.verdict.Reason, wait: step.Wait}
			ex.nRetries++
		}
		if step.Wait > 0 {
			t := time.NewTimer(step.Wait)
			<-t.C
			t.Stop()
		}
	}
}

// resultLabel names an attempt's result for metrics.
func resultLabel(v policy.Verdict) string {
	if v.Class == policy.ClassRetryable {
		return v.Reason.String()
	}
	return v.Class.String()
}

func breakerResult(h policy.Health) breaker.Result {
	switch h {
	case policy.HealthSuccess:
		return breaker.Success
	case policy.HealthFailure:
		return breaker.Failure
	default:
		return breaker.Excluded
	}
}

// attempt sends the request once and reads the response head: the status,
// headers and the first body bytes (all of a small body). The attempt's
// timeout is first_byte, cut short by the route's deadline.
func (ex *exchange) attempt() policy.Outcome {
	timeout := min(ex.up.firstByte, time.Until(ex.deadline))
	if timeout <= 0 {
		return policy.Outcome{Fault: policy.FaultTimeout}
	}
	if err := ex.up.client.DoTimeout(ex.req, ex.resp, timeout); err != nil {
		return policy.Outcome{Fault: faultOf(err)}
	}
	status := ex.resp.StatusCode()
	if f := ex.readHead(status); f != policy.FaultNone {
		ex.closeBody()
		return policy.Outcome{Fault: f}
	}
	out := policy.Outcome{Status: status}
	if status == 429 {
		out.InsufficientQuota = policy.InsufficientQuota(ex.head)
	}
	return out
}

// readHead reads the body's first bytes into ex.head before anything is
// committed, so a body that dies before its first byte is still a
// retryable failure. It reads a whole body when it fits (and always for
// 429/5xx, whose bodies are inspected or kept as the last reply), and one
// chunk of anything longer.
func (ex *exchange) readHead(status int) policy.Fault {
	ex.head, ex.headOff = ex.head[:0], 0
	ex.body = ex.resp.BodyStream()
	if ex.body == nil {
		return policy.FaultNone
	}
	cl := ex.resp.Header.ContentLength()
	whole := (cl >= 0 && cl <= headSize) || status == 429 || status >= 500
	for len(ex.head) < cap(ex.head) {
		n, err := ex.body.Read(ex.head[len(ex.head):cap(ex.head)])
		ex.head = ex.head[:len(ex.head)+n]
		if err == io.EOF {
			ex.closeBody() // fully read: the connection goes back to the pool
			return policy.FaultNone
		}
		if err != nil {
			if isTimeout(err) {
				return policy.FaultTimeout
			}
			return policy.FaultReset
		}
		if !whole && len(ex.head) > 0 {
			break
		}
	}
	markStreaming(ex.resp)
	return policy.FaultNone
}

// closeBody closes the upstream body stream: a fully read one returns its
// connection to the pool, a partly read one closes the connection, which
// also tells a model server to stop generating.
func (ex *exchange) closeBody() {
	if ex.body != nil {
		_ = ex.resp.CloseBodyStream()
		ex.body = nil
	}
}

// conclude answers the client once the loop stops with the last attempt.
func (ex *exchange) conclude() {
	switch {
	case ex.verdict.Class == policy.ClassSuccess:
		ex.outcome = "ok"
		ex.commit(false)
	case ex.verdict.Class == policy.ClassPassThrough:
		ex.outcome = "pass_through"
		ex.commit(false)
	case ex.hasReply:
		ex.giveUp()
	default:
		ex.noReply()
	}
}

// giveUp returns the last upstream reply as final: Sturdy will not retry
// it and tells the client's SDK not to either.
func (ex *exchange) giveUp() {
	ex.outcome = "exhausted"
	ex.commit(true)
}

// noReply answers when no attempt produced a response.
func (ex *exchange) noReply() {
	status, code := 502, CodeUpstreamUnreachable
	what := "could not reach upstream %q"
	if ex.fault == policy.FaultReset {
		what = "upstream %q closed the connection before responding"
	}
	if ex.fault == policy.FaultTimeout {
		status, code, what = 504, CodeUpstreamTimeout, "upstream %q sent no response in time"
	}
	if ex.attempts > 1 {
		code = CodeRetriesExhausted
	}
	msg := fmt.Sprintf(what+" (%d attempt%s, %s); retry later or check the upstream", ex.up.name,
		ex.attempts, plural(ex.attempts), stopText(ex.stop))
	ex.outcome = "upstream_error"
	ex.fail(status, code, msg, 0)
}

func (ex *exchange) circuitOpen() {
	wait := ex.up.breaker.ProbeIn(time.Now())
	msg := fmt.Sprintf("upstream %q is failing and its circuit breaker is open; Sturdy is not sending it traffic. Retry after the Retry-After delay", ex.up.name)
	ex.outcome = "circuit_open"
	ex.fail(503, CodeCircuitOpen, msg, max(wait, time.Second))
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func stopText(s policy.Stop) string {
	switch s {
	case policy.StopMaxAttempts:
		return "max_attempts reached"
	case policy.StopDeadline:
		return "route deadline reached"
	case policy.StopNotReplayable:
		return "request not safe to replay"
	case policy.StopNotOn:
		return "not in retry.on"
	case policy.StopBreakerOpen:
		return "circuit breaker opened"
	default:
		return "not retried"
	}
}

// fail writes an error Sturdy produced itself.
func (ex *exchange) fail(status int, code, msg string, retryAfter time.Duration) {
	ex.closeBody()
	ex.status, ex.errCode = status, code
	d := errorDetails{Attempts: ex.attempts}
	if ex.up != nil {
		d.Upstream = ex.up.name
	}
	if ex.hasReply {
		d.LastStatus = ex.resp.StatusCode()
	}
	writeError(ex.ctx, status, code, msg, d, retryAfter)
	ex.bytesOut = int64(len(ex.ctx.Response.Body()))
	ex.ctx.Response.Header.SetBytesKV(hdrRequestID, ex.id)
	if ex.attempts > 0 {
		ex.ctx.Response.Header.SetBytesKV(hdrAttempts, strconv.AppendInt(nil, int64(ex.attempts), 10))
	}
	ex.ttfb = time.Since(ex.start)
}

// commit sends the upstream's reply to the client: status and headers as
// received (minus hop-by-hop), then the body — at once when it is already
// whole, else as a stream. final marks a reply Sturdy gave up retrying.
func (ex *exchange) commit(final bool) {
	ctx, rh := ex.ctx, &ex.ctx.Response.Header
	ex.status = ex.resp.StatusCode()
	copyResponseHeaders(rh, &ex.resp.Header)
	passThrough := ex.verdict.Class == policy.ClassPassThrough
	if !passThrough {
		rh.SetBytesKV(hdrRequestID, ex.id)
	}
	if !passThrough || ex.attempts > 1 {
		rh.SetBytesKV(hdrAttempts, strconv.AppendInt(nil, int64(ex.attempts), 10))
	}
	// A 429 insufficient_quota is passed through, but no retry can help it.
	if final || (passThrough && ex.status == 429) {
		rh.SetBytesKV(hdrShouldRetry, valFalse)
	}
	ex.ttfb = time.Since(ex.start)
	if ex.body == nil {
		if ctx.IsHead() {
			ctx.Response.SkipBody = true
			return
		}
		ctx.Response.SetBody(ex.head)
		ex.bytesOut = int64(len(ex.head))
		return
	}
	ex.streaming = true
	ex.p.m.OpenStreams.Inc()
	ex.kind = kindOf(ex.resp.Header.ContentType())
	cl := ex.resp.Header.ContentLength()
	ex.chunked = cl < 0
	ctx.Response.SetBodyStream(ex, max(cl, -1))
}

func kindOf(contentType []byte) streamKind {
	mt, _, _ := bytes.Cut(contentType, []byte(";"))
	mt = bytes.TrimSpace(mt)
	switch {
	case bytes.EqualFold(mt, []byte("text/event-stream")):
		return streamSSE
	case bytes.EqualFold(mt, []byte("application/x-ndjson")), bytes.EqualFold(mt, []byte("application/ndjson")),
		bytes.EqualFold(mt, []byte("application/jsonl")), bytes.EqualFold(mt, []byte("application/x-jsonlines")):
		return streamNDJSON
	}
	return streamOther
}

// finish logs and measures the request and returns the exchange to the
// pool.
func (ex *exchange) finish() {
	ex.logAccess()
	ex.measure()
	ex.closeBody()
	ex.req.Reset()
	ex.resp.Reset()
	*ex = exchange{head: ex.head[:0], id: ex.id[:0], uri: ex.uri[:0], req: ex.req, resp: ex.resp}
	exchangePool.Put(ex)
}

// measure records the finished request in the metrics.
func (ex *exchange) measure() {
	m := ex.p.m
	route, up := "", ""
	if ex.route != nil {
		route, up = ex.route.name, ex.up.name
		ex.up.inFlight.Add(-1)
	}
	m.Requests.WithLabelValues(route, up, metrics.StatusClass(ex.status), ex.outcome).Inc()
	if ex.stop != policy.StopNone && ex.stop != policy.StopFinal {
		m.GiveUps.WithLabelValues(up, ex.stop.String()).Inc()
	}
	if ex.route != nil {
		m.TimeToFirstByte.WithLabelValues(route).Observe(ex.ttfb.Seconds())
		stream := "false"
		if ex.streaming {
			stream = "true"
			m.OpenStreams.Dec()
		}
		m.Duration.WithLabelValues(route, stream).Observe(time.Since(ex.start).Seconds())
	}
	m.InFlight.Dec()
}
