package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"sturdy/metrics"
	"sturdy/policy"
)

// headSize is how much of a response body Sturdy holds before committing:
// a whole small body (most JSON replies), or the first chunk of a stream.
const headSize = 32 << 10

// maxLoggedRetries bounds the retries listed on an access line.
const maxLoggedRetries = 16

// maxLoggedTargets bounds the targets listed on an access line.
const maxLoggedTargets = 8

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
	body0      []byte // a rewritten body (model changed for a target)
	scratch    []byte // for header values built per request

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

	attempts  int // across all targets
	perTarget int // attempts allowed on each target
	// firstToken bounds each attempt's first body byte when the request
	// asks for a stream (route first_token); 0: no such bound.
	firstToken time.Duration
	retries    [maxLoggedRetries]retryNote
	nRetries   int
	// Targets: ti indexes route.targets; n counts attempts on it; cred
	// keys its cooldowns; slot is the upstream whose max_in_flight slot
	// is held; tried logs each target's fate; obstacle is why the last
	// unusable target could not be used.
	ti        int
	n         int
	cred      uint64
	credKnown bool
	slot      *upstream
	entered   *upstream // whose in-flight count this request is in
	replyUp   *upstream // the upstream that sent the last reply
	tried     [maxLoggedTargets]targetNote
	nTried    int
	obstacle  obstacle
	hasReply  bool // the last attempt produced a status (no fault)
	verdict   policy.Verdict
	fault     policy.Fault
	stop      policy.Stop

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
// absolute URIs), clients over their rate limit, paths no route serves,
// bodies over the route's max.
func (ex *exchange) admit() bool {
	ctx := ex.ctx
	uri := ctx.Request.Header.RequestURI()
	if ctx.IsConnect() || len(uri) == 0 || uri[0] != '/' {
		ex.reject(400, CodeBadRequest, "Sturdy is a reverse proxy, not an open proxy: send origin-form requests (a path like /v1/chat/completions), not CONNECT or absolute URIs")
		return false
	}
	if bothFramings(ctx.Request.Header.RawHeaders()) {
		// Both framings at once is the classic request-smuggling shape:
		// refuse it and close the connection, so nothing after it on the
		// connection is read as another request.
		ex.reject(400, CodeBadRequest, "request has both Content-Length and Transfer-Encoding; send one")
		ctx.SetConnectionClose()
		return false
	}
	if !ex.tbl.authorized(ctx.Request.Header.PeekBytes(hdrAuthorization)) {
		ex.outcome = outcomeUnauthorized
		ex.fail(401, CodeInvalidAPIKey, "missing or invalid API key: send the key Sturdy issued you as \"Authorization: Bearer <key>\"", 0)
		return false
	}
	now := time.Now()
	for _, cl := range ex.tbl.clients {
		if wait, ok := cl.take(ctx.Request.Header.PeekBytes(cl.header), now); !ok {
			ex.p.m.RateLimited.WithLabelValues("client").Inc()
			ex.outcome = outcomeRateLimited
			ex.fail(429, CodeRateLimited, fmt.Sprintf("this client is over its limit of %g requests per second (by %s); retry after the Retry-After delay",
				cl.opts.RequestsPerSecond, cl.opts.KeyHeader), wait)
			return false
		}
	}
	ex.route = ex.tbl.match(rawPath(uri), ctx.Request.Body())
	if ex.route == nil {
		ex.reject(404, CodeBadRequest, fmt.Sprintf("no route serves path %q (and this body's model); configure a route whose path_prefix (and model) matches it", rawPath(uri)))
		return false
	}
	ex.up = ex.route.upstream
	if n := len(ctx.Request.Body()); n > ex.route.maxBody {
		ex.reject(413, CodeRequestTooLarge, fmt.Sprintf("request body of %d bytes is larger than route %q accepts (%d bytes); send a smaller request", n, ex.route.name, ex.route.maxBody))
		return false
	}
	return true
}

func (ex *exchange) reject(status int, code, msg string) {
	ex.outcome = outcomeRejected
	ex.fail(status, code, msg, 0)
}

// rawPath is the request URI up to the query, as received.
func rawPath(uri []byte) []byte {
	if i := bytes.IndexByte(uri, '?'); i >= 0 {
		return uri[:i]
	}
	return uri
}

// prepare builds the parts of the upstream request that every target
// shares; useTarget adds the target's own (URL, credentials, model).
func (ex *exchange) prepare() {
	ctx, req := ex.ctx, ex.req
	rh := &ctx.Request.Header
	ex.deadline = ex.start.Add(ex.route.deadline)
	if d, ok := policy.ClientTimeout(rh.PeekBytes(hdrStainlessTimeout), rh.PeekBytes(hdrStainlessReadTimeout),
		rh.PeekBytes(hdrRequestTimeout), rh.PeekBytes(hdrXRequestTimeout)); ok && d < ex.route.deadline {
		ex.deadline = ex.start.Add(d)
	}
	ex.replayable = policy.Replayable(ctx.Method(), rawPath(rh.RequestURI()), len(rh.PeekBytes(hdrIdempotencyKey)) > 0)
	if ex.route.firstToken > 0 {
		ex.firstToken = firstTokenLimit(ex.route.firstToken, rawPath(rh.RequestURI()), ctx.Request.Body())
	}
	ex.perTarget = ex.route.retry.MaxAttempts
	if policy.RequestedRetries(rh.PeekBytes(hdrStainlessRetryCount)) > 0 && ex.route.clientRetries > 0 {
		ex.perTarget = min(ex.perTarget, ex.route.clientRetries)
	}

	rh.CopyTo(&req.Header)
	dropHopHeaders(&req.Header)
	// The body is already read whole: a 100-continue handshake upstream
	// would only add a round trip.
	req.Header.DelBytes(hdrExpect)
	req.Header.ResetConnectionClose()
	req.Header.SetNoDefaultContentType(true)
	req.Header.SetBytesKV(hdrRequestID, ex.id)
	xff := ex.scratch[:0]
	if prior := req.Header.PeekBytes(hdrForwardedFor); len(prior) > 0 {
		xff = append(append(xff, prior...), ", "...)
	}
	if a, ok := netip.AddrFromSlice(ctx.RemoteIP()); ok {
		xff = a.Unmap().AppendTo(xff)
	}
	req.Header.SetBytesKV(hdrForwardedFor, xff)
	ex.scratch = xff
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
		ex.setAttemptsHeader()
	}
	ex.ttfb = time.Since(ex.start)
}

// commit sends the upstream's reply to the client: status and headers as
// received (minus hop-by-hop), then the body — at once when it is already
// whole, else as a stream. final marks a reply Sturdy gave up retrying.
func (ex *exchange) commit(final bool) {
	ctx, rh := ex.ctx, &ex.ctx.Response.Header
	// The reply may be an earlier target's, when later ones were skipped.
	ex.up = ex.replyUp
	ex.status = ex.resp.StatusCode()
	copyResponseHeaders(rh, &ex.resp.Header)
	passThrough := ex.verdict.Class == policy.ClassPassThrough
	if !passThrough {
		rh.SetBytesKV(hdrRequestID, ex.id)
		rh.SetBytesK(hdrUpstream, ex.up.name)
	}
	if !passThrough || ex.attempts > 1 {
		ex.setAttemptsHeader()
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

// firstTokenLimit returns the route's first_token for requests that ask
// for a stream — "stream": true in the body, or Ollama's /api/chat and
// /api/generate, which stream unless told "stream": false — and 0 for the
// rest: a non-streamed reply's first byte comes only when generation ends.
func firstTokenLimit(limit time.Duration, path, body []byte) time.Duration {
	s := gjson.GetBytes(body, "stream")
	ollama := bytes.HasSuffix(path, []byte("/api/chat")) || bytes.HasSuffix(path, []byte("/api/generate"))
	if s.Bool() || (ollama && s.Type != gjson.False) {
		return limit
	}
	return 0
}

// setAttemptsHeader sets x-sturdy-attempts on the client's response.
func (ex *exchange) setAttemptsHeader() {
	ex.scratch = strconv.AppendInt(ex.scratch[:0], int64(ex.attempts), 10)
	ex.ctx.Response.Header.SetBytesKV(hdrAttempts, ex.scratch)
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
	ex.leaveTarget()
	ex.logAccess()
	ex.measure()
	ex.closeBody()
	ex.req.Reset()
	ex.resp.Reset()
	*ex = exchange{head: ex.head[:0], id: ex.id[:0], uri: ex.uri[:0], req: ex.req, resp: ex.resp, body0: ex.body0[:0],
		scratch: ex.scratch[:0]}
	exchangePool.Put(ex)
}

// measure records the finished request in the metrics.
func (ex *exchange) measure() {
	m := ex.p.m
	route, up := "", ""
	if ex.route != nil {
		route, up = ex.route.name, ex.up.name
	}
	m.Requests.WithLabelValues(route, up, metrics.StatusClass(ex.status), ex.outcome).Inc()
	if ex.stop != policy.StopNone && ex.stop != policy.StopFinal {
		m.GiveUps.WithLabelValues(up, ex.stop.String()).Inc()
	}
	if r := ex.route; r != nil {
		r.ttfb.Observe(ex.ttfb.Seconds())
		dur := r.durPlain
		if ex.streaming {
			dur = r.durStream
			m.OpenStreams.Dec()
		}
		dur.Observe(time.Since(ex.start).Seconds())
	}
	m.InFlight.Dec()
}
