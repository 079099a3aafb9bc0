package proxy

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"net/netip"
	"strconv"
	"time"
	"unsafe"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"sturdy/listener"
	"sturdy/policy"
	"sturdy/upstream"
)

// Handle serves one client request: admit it, pick its route, run the
// attempt loop, and (unless a stream goes on) log and release it.
func (p *Proxy) Handle(ctx *fasthttp.RequestCtx) {
	ex := exchangePool.Get().(*exchange)
	ex.p, ex.ctx, ex.tbl = p, ctx, p.tbl.Load()
	defer survive(ex)
	ex.req.start = time.Now()
	p.m.InFlight.Inc()
	ex.req.id = ex.requestID(ex.req.id[:0])
	ex.tr = startTrace(p.tracers.cur.Load(), ctx, ex.req.id, ex.req.start)
	ex.req.metered = ex.tr != nil && ex.tr.rec // a recorded span tells the reply's usage
	if ex.client.cc = listener.ConnOf(ctx.Conn()); ex.client.cc != nil {
		ex.client.cc.Serving(&ex.client)
	}
	if err := ex.admit(); err != nil {
		if err != answeredHere {
			ex.fail(err)
		}
		ex.finish()
		return
	}
	ex.prepare()
	ex.tr.route(ex.ctx.Method(), ex.req.route, ex.req.call, ex.req.model)
	last, in := &ex.last, &ex.in // the try in progress, then the last one made; what stood in the way
	ex.run(last, in)
	ex.respond(last, in)
	if !ex.out.reader { // else the body's reader ends it (CloseWithError)
		ex.finish()
	}
}

// requestID takes the client's X-Request-Id when sane, else makes one.
func (ex *exchange) requestID(dst []byte) []byte {
	if v := ex.ctx.Request.Header.PeekCanonical(hdrRequestID); len(v) > 0 && len(v) <= 128 && printable(v) {
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

// admit refuses what Sturdy will not forward — proxy requests (CONNECT,
// absolute URIs), smuggling-shaped framing, clients without an accepted
// key or over their rate limit, paths no route serves, bodies over the
// route's max — and picks the route (and, for a request that asks for a
// stream, its first-token bound).
func (ex *exchange) admit() *apiError {
	ctx := ex.ctx
	uri := ctx.Request.Header.RequestURI()
	ex.out.outcome = outcomeRejected
	ex.req.call = policy.CallOf(rawPath(uri)) // first: every answer, a refusal too, is in its API's shape
	if e := malformed(ctx, uri); e != nil {
		return e
	}
	if ex.looped() {
		return newError(CodeLoopDetected)
	}
	if e, answered := crossOrigin(ctx, ex.tbl); e != nil {
		return e
	} else if answered {
		ex.out.status = fasthttp.StatusNoContent
		ex.out.outcome = outcomeOK
		return answeredHere
	}
	if !ex.knowKey() {
		ex.out.outcome = outcomeUnauthorized
		return newError(CodeInvalidAPIKey)
	}
	model, stream := bodyFields(ctx.Request.Body())
	ex.req.model = policy.ModelKey(model.Str) // the body's own bytes, unless too long to keep
	r := ex.tbl.match(rawPath(uri), model)
	if r == nil {
		return newError(CodeRouteNotFound, rawPath(uri))
	}
	first := r.serving(ex.req.call.API, 0)
	if first < 0 {
		return newError(CodeAPINotServed, r.name, apiName(ex.req.call.API))
	}
	ex.req.route, ex.loop.ti = r, first
	if asksToStream(ex.req.call.API, stream) {
		ex.req.firstToken = r.firstToken
	}
	if !confined(rawPath(uri), r.prefix) {
		// An upstream that resolves dot-segments would serve a path the
		// route does not cover, with the route's credentials.
		return newError(CodeBadRequest, fmt.Sprintf("the path leaves route %q's path_prefix %q once its dot-segments (. and ..) are resolved; send the path without them",
			r.name, r.prefix))
	}
	if n := len(ctx.Request.Body()); n > r.maxBody {
		return newError(CodeRequestTooLarge, fmt.Sprintf("route %q", r.name), r.maxBody)
	}
	var e *apiError
	if ex.req.bodyHeld, e = holdBody(&ex.p.bodies, len(ctx.Request.Body())); e != nil {
		return e
	}
	pr, fromHeader, e := priorityOf(r, &ctx.Request.Header)
	if e != nil {
		return e
	}
	ex.req.priority = ex.req.key.classOf(pr, fromHeader)
	if e = ex.tbl.hooks.reserve(ex, time.Now()); e != nil {
		return e
	}
	ex.out.outcome = ""
	return nil
}

// answeredHere is admit's word that it answered the request itself (a
// CORS preflight): nothing more is sent.
var answeredHere = &apiError{}

// malformed refuses a request of a shape no origin-form request has
// (CONNECT, an absolute URI, a fragment), or that has both framings.
func malformed(ctx *fasthttp.RequestCtx, uri []byte) *apiError {
	if ctx.IsConnect() || len(uri) == 0 || uri[0] != '/' {
		return newError(CodeBadRequest, "Sturdy is a reverse proxy, not an open proxy: send origin-form requests (a path like /v1/chat/completions), not CONNECT or absolute URIs")
	}
	if bytes.IndexByte(uri, '#') >= 0 {
		// An origin-form target has no fragment. fasthttp would drop it on
		// the way upstream, after the path_prefix check saw it as part of
		// a segment: "/v1/..#x" would reach "/v1/..".
		return newError(CodeBadRequest, "the request target has a fragment ('#'); an HTTP request path never does: leave it out (or send it as %23)")
	}
	if bothFramings(ctx.Request.Header.RawHeaders()) {
		// Both framings at once is the classic request-smuggling shape:
		// refuse it and close the connection, so nothing after it on the
		// connection is read as another request.
		ctx.SetConnectionClose()
		return newError(CodeBadRequest, "the request has both Content-Length and Transfer-Encoding; send one")
	}
	return nil
}

// knowKey reports whether the request's credential key is one auth
// accepts (any, without auth keys), and finds its client_keys_file
// settings; the key's SHA-256 is taken once, for both, and only when
// either is configured.
func (ex *exchange) knowKey() bool {
	t := ex.tbl
	if len(t.authKeys) == 0 && len(t.keys) == 0 {
		return true
	}
	_, key := credential(&ex.ctx.Request.Header)
	sum := sha256.Sum256(key)
	if !t.authorized(len(key) > 0, &sum) {
		return false
	}
	ex.req.key = t.keys[sum]
	return true
}

// priorityOf is the class of a request on route r in a concurrency
// queue: the route's, or its x-sturdy-priority where the route lets it
// say (priority_header); a value that names no class is a bad request.
func priorityOf(r *route, h *fasthttp.RequestHeader) (pr upstream.Priority, fromHeader bool, e *apiError) {
	v := h.PeekCanonical(hdrPriority)
	if !r.priorityHeader || len(v) == 0 {
		return r.priority, false, nil
	}
	p, ok := upstream.ParsePriority(string(v))
	if !ok {
		return 0, false, newError(CodeBadRequest, fmt.Sprintf("x-sturdy-priority must be interactive or batch (got %s)",
			strconv.Quote(spanText(v[:min(len(v), 32)]))))
	}
	return p, true, nil
}

// looped reports whether the request already went through this process:
// its Via names this process's random id (an upstream that is Sturdy's
// own listener, or a DNS name resolving to it). Another Sturdy in the
// chain (a sidecar in front of a shared one) has an id of its own.
func (ex *exchange) looped() bool {
	h := &ex.ctx.Request.Header
	if h.PeekCanonical(hdrVia) == nil {
		return false // the common case: no Via at all
	}
	for _, v := range h.PeekAll(string(hdrVia)) {
		if bytes.Contains(v, ex.p.viaID) {
			return true
		}
	}
	return false
}

// prepare fixes what else the request's attempts share: its deadline,
// whether it may be replayed, the request's retry policy, and the
// upstream request's headers (useTarget adds each target's URL,
// credentials and model).
func (ex *exchange) prepare() {
	ctx, r, q := ex.ctx, ex.req.route, &ex.req
	rh := &ctx.Request.Header
	// A client's timeout is met a margin before it: 504 deadline_exceeded,
	// not to be retried, rather than a client that gives up and retries.
	q.until = q.start.Add(r.deadline)
	ct := policy.ClientTimeout(rh.PeekCanonical(hdrStainlessTimeout), rh.PeekCanonical(hdrStainlessLang),
		rh.PeekCanonical(hdrStainlessReadTimeout), rh.PeekCanonical(hdrRequestTimeout), rh.PeekCanonical(hdrXRequestTimeout))
	if ct.Total > 0 {
		q.until = earliest(q.until, q.start.Add(ct.Total-policy.Margin(ct.Total)))
	}
	q.deadline = q.until
	if ct.Head > 0 {
		q.deadline = earliest(q.deadline, q.start.Add(ct.Head-policy.Margin(ct.Head)))
	}
	q.replayable = q.call.Replayable(ctx.Method(), len(rh.PeekCanonical(hdrIdempotencyKey)) > 0)
	if r.tokenPaced && q.call.Charged() {
		q.metered = true
		q.needUsage(ctx.Request.Body())
	}
	q.retry = r.retry
	if policy.RequestedRetries(rh.PeekCanonical(hdrStainlessRetryCount)) > 0 {
		// The client is retrying on its own: its retries and ours multiply.
		q.retry.MaxAttempts = min(q.retry.MaxAttempts, r.clientRetries)
	}

	h := &q.msg.Header
	rh.CopyTo(h)
	dropHopHeaders(h)
	// The body is already read whole: a 100-continue handshake upstream
	// would only add a round trip.
	h.DelBytes(hdrExpect)
	h.DelBytes(hdrPriority) // Sturdy's own: the upstream has no use for it
	h.ResetConnectionClose()
	h.SetNoDefaultContentType(true)
	h.SetBytesKV(hdrRequestID, q.id)
	via := ex.p.via
	if !rh.IsHTTP11() {
		via = ex.p.via10
	}
	h.AddBytesKV(hdrVia, via) // RFC 9110 §7.6.3: this hop, after the client's
	ex.forwarded(h)
}

// earliest is the earlier of a and b.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// forwarded sets X-Forwarded-For, -Host and -Proto. From a trusted proxy
// (server.trusted_proxies) its values are kept and Sturdy's peer is
// appended to X-Forwarded-For; from anyone else they are replaced by what
// Sturdy saw, so a client cannot pose as another address or host.
func (ex *exchange) forwarded(h *fasthttp.RequestHeader) {
	ctx, q := ex.ctx, &ex.req
	peer, _ := netip.AddrFromSlice(ctx.RemoteIP())
	peer = peer.Unmap()
	trusted := ex.tbl.trusts(peer)
	xff := q.scratch[:0]
	if trusted && h.PeekCanonical(hdrForwardedFor) != nil {
		for _, prior := range h.PeekAll(string(hdrForwardedFor)) { // every line the proxy sent, in order
			xff = append(append(xff, prior...), ", "...)
		}
	}
	if peer.IsValid() {
		xff = peer.AppendTo(xff)
	}
	// Every line the client sent goes (SetBytesKV replaces only the
	// first); X-Forwarded-For is one line from here on.
	for i, k := range [][]byte{hdrForwardedFor, hdrForwardedHost, hdrForwardedProto} {
		if (i == 0 || !trusted) && h.PeekCanonical(k) != nil {
			h.DelBytes(k)
		}
	}
	h.SetBytesKV(hdrForwardedFor, xff)
	q.scratch = xff
	if len(h.PeekCanonical(hdrForwardedHost)) == 0 {
		h.SetBytesKV(hdrForwardedHost, ctx.Request.Header.Host())
	}
	if len(h.PeekCanonical(hdrForwardedProto)) == 0 {
		proto := valHTTP
		if ctx.IsTLS() {
			proto = valHTTPS
		}
		h.SetBytesKV(hdrForwardedProto, proto)
	}
}

// bodyFields reads the body's top-level "model" and "stream" in place,
// in one pass over its keys (a gjson.Get each would scan it from the
// start twice); the first of each key counts, as Get finds it.
func bodyFields(body []byte) (model, stream gjson.Result) {
	// A value ForEach gives always Exists: that tells a key seen.
	gjson.Parse(unsafe.String(unsafe.SliceData(body), len(body))).ForEach(func(k, v gjson.Result) bool {
		switch {
		case k.Str == "model" && !model.Exists():
			model = v
		case k.Str == "stream" && !stream.Exists():
			stream = v
		}
		return !model.Exists() || !stream.Exists()
	})
	return model, stream
}

// asksToStream reports whether a request asks for a stream — "stream":
// true in the body, or Ollama's /api/chat and /api/generate, which stream
// unless told "stream": false. Only those get the route's first_token: a
// non-streamed reply's first byte comes only when generation ends.
func asksToStream(api policy.API, stream gjson.Result) bool {
	return stream.Bool() || (api == policy.APIOllama && stream.Type != gjson.False)
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
