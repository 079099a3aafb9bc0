package proxy

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"sturdy/events"
	"sturdy/policy"
	"sturdy/upstream"
)

// respond answers the client once the attempt loop has stopped: with the
// last upstream reply when the last attempt (last) produced one (as final
// when it was a failure), else with what stood in the way of the targets
// (in), else with why no attempt produced a reply.
func (ex *exchange) respond(last *attempt, in *obstruction) {
	lp := &ex.loop
	switch replied := last.replied(); {
	case lp.stop == policy.StopClientGone:
		ex.leftUnanswered(last.rp)
	case replied && last.verdict.Class == policy.ClassSuccess:
		ex.out.outcome = outcomeOK
		ex.commit(last, false)
	case replied && last.verdict.Class == policy.ClassPassThrough:
		ex.out.outcome = outcomePassThrough
		ex.commit(last, false)
	case replied:
		ex.out.outcome = outcomeExhausted
		ex.commit(last, true)
	case in.blocked && (lp.attempts == 0 || time.Until(ex.req.deadline) > 0):
		ex.obstructed(in.obstacle)
	case in.sharedRefused != "":
		ex.out.outcome = outcomeSharedState
		ex.fail(sharedFailure(in.sharedRefused))
	case lp.stop == policy.StopShutdown:
		ex.out.outcome = outcomeShuttingDown
		ex.fail(newError(CodeShuttingDown, ex.target().up.Name(), ex.notes.text(ex.loop.stop)))
	default:
		ex.noReply(last)
	}
	if ex.st.rp != last.rp { // not the stream's to give back as it ends
		last.rp.release()
	}
}

// commit sends the reply of attempt a (the last one) to the client:
// status and headers as received (minus hop-by-hop), then the body — at
// once when it is already whole, else as a stream. final marks a reply
// Sturdy gave up retrying.
func (ex *exchange) commit(a *attempt, final bool) {
	ctx, rh, rp := ex.ctx, &ex.ctx.Response.Header, a.rp
	src := rp.msg
	// The reply may be an earlier target's, when later ones were skipped:
	// the request went where it came from.
	ex.loop.ti, ex.loop.ep = a.ti, a.ep
	ex.req.deadline = ex.req.until // the head is answered: a client's head timeout bounds nothing more (a rescue)
	ex.out.status = src.StatusCode()
	copyResponseHeaders(rh, &src.Header)
	markCORS(rh, &ctx.Request.Header, ex.tbl.corsOrigins)
	passThrough := ex.out.outcome == outcomePassThrough
	if !passThrough {
		rh.SetBytesKV(hdrRequestID, ex.req.id)
		rh.SetBytesK(hdrUpstream, a.up.Name())
	}
	if !passThrough || ex.loop.attempts > 1 {
		ex.setAttemptsHeader(ex.loop.attempts)
	}
	// A 429 insufficient_quota (or 402 billing_error) is passed through,
	// but no retry can help it.
	if final || (passThrough && (ex.out.status == 429 || ex.out.status == 402)) {
		rh.SetBytesKV(hdrShouldRetry, valFalse)
	}
	ex.out.ttft = time.Since(ex.req.start)
	ex.out.ttfb = a.headAt.Sub(ex.req.start)
	defer func() { ex.report().committed(ex.req.start.Add(ex.out.ttft), ex.out.streaming) }()
	if rp.body == nil && !rp.heldToEnd {
		if ctx.IsHead() {
			ctx.Response.SkipBody = true
			return
		}
		ex.setWhole(rp, &ex.req.route.targets[a.ti])
		return
	}
	ex.st.rp = rp // the stream's from here: it reads the rest of it
	ex.st.kind = events.KindOf(src.Header.ContentType())
	if ex.st.kind != 0 {
		ex.st.scan.Reset(ex.st.kind)
	}
	cl := src.Header.ContentLength()
	ex.st.chunked, ex.st.closeDelimited = cl < 0, cl == -2
	upstream.CapReads(src, ex.req.responseCap(ex.st.streamed()))
	if ex.st.metering = ex.req.metered; ex.st.metering {
		ex.st.meter.start(ex.req.call.API, ex.st.kind)
	}
	ex.st.followForRescue(a.ti)
	if ex.st.stripUsage && cl >= 0 { // an event less than the upstream's length: sent chunked
		cl, ex.st.chunked = -1, true
	}
	ex.client.enter(phaseStream)
	if cl < 0 && !ctx.Request.Header.IsHTTP11() {
		ex.whole()
		return
	}
	ex.startStream(max(cl, -1))
}

// startStream makes the reply a stream the exchange's stream relays
// (Read), of size bytes (-1: unknown).
func (ex *exchange) startStream(size int) {
	ex.out.streaming = true
	ex.p.streams.track(ex.st, true)
	ex.serveBody(size)
}

// serveBody makes the exchange's stream the client's body reader (Read),
// of size bytes (-1: unknown): fasthttp pulls from it once the handler
// returns, and CloseWithError ends the request.
func (ex *exchange) serveBody(size int) {
	ex.out.reader = true
	ex.ctx.SetBodyStream(ex.st, size)
}

// setWhole answers with rp's body, read whole with its head (to its
// stream's terminator: untilTerminator), from target t: metered first
// when its usage is needed, then without the usage chunk Sturdy asked t
// for.
func (ex *exchange) setWhole(rp *reply, t *target) {
	body := ex.untilTerminator(rp)
	kind := events.KindOf(rp.msg.Header.ContentType())
	if ex.req.metered {
		ex.st.metering = true
		ex.st.meter.start(ex.req.call.API, kind)
		ex.st.meter.feed(body)
	}
	if kind == events.SSE && ex.req.asksUsage(t) {
		body = withoutUsage(body)
	}
	ex.ctx.Response.SetBody(body)
	ex.out.bytesOut = int64(len(body))
}

// untilTerminator returns the whole body of rp (its head) up to the end
// of its stream's terminator, when it is an SSE or NDJSON stream of a
// known API (what follows [DONE] is not the stream's); any other body as
// it is.
func (ex *exchange) untilTerminator(rp *reply) []byte {
	body := rp.head
	kind := events.KindOf(rp.msg.Header.ContentType())
	if kind == 0 || ex.req.call.API == policy.APIOther {
		return body
	}
	var s events.Scanner
	s.Reset(kind)
	return body[:s.Feed(body)]
}

// leftUnanswered ends a request whose client left before its response
// began: nobody is left to answer (rp, the reply at hand, is closed).
func (ex *exchange) leftUnanswered(rp *reply) {
	rp.close()
	ex.out.outcome, ex.out.status = outcomeClientGone, 499
	ex.ctx.SetConnectionClose()
}

// maxWholeBody bounds a body read whole for an HTTP/1.0 client.
const maxWholeBody = 64 << 20

// whole answers an HTTP/1.0 client, which cannot read chunks, a body of
// unknown length with a Content-Length: the rest of the upstream body is
// read first (bounded by idle, max_duration, maxWholeBody and the buffer
// budget), through the same reader a stream uses, so an SSE or NDJSON
// failure still ends with its error event; any other failed body gets
// Sturdy's own 502, since nothing has reached the client yet — 502
// response_too_large for one past either bound.
func (ex *exchange) whole() {
	body := make([]byte, 0, headSize)
	var err error
	for err == nil {
		if body, err = ex.held.grow(&ex.p.held, body, maxWholeBody+1, heldForHTTP10); err != nil {
			break // past maxWholeBody (a body of exactly that size ends in EOF first) or the budget
		}
		var n int
		n, err = ex.st.Read(body[len(body):cap(body)])
		body = body[:len(body)+n]
	}
	if ex.client.isGone.Load() { // the client left while the body was read
		ex.leftUnanswered(ex.st.rp)
		return
	}
	ex.st.rp.close()
	switch {
	case errors.Is(err, errAtLimit):
		ex.out.outcome = outcomeUpstreamError
		ex.fail(newError(CodeResponseTooLarge, ex.target().up.Name(), sizeText(maxWholeBody)+" per response"))
		return
	case errors.Is(err, errBuffersFull):
		ex.out.outcome = outcomeUpstreamError
		ex.fail(newError(CodeResponseTooLarge, ex.target().up.Name(), "server.max_buffered_bytes, for all clients together, is in use"))
		return
	case err != io.EOF:
		ex.out.outcome = outcomeUpstreamError
		ex.fail(newError(CodeUpstreamUnreachable, ex.target().up.Name(), "failed mid-body", ex.notes.text(ex.loop.stop)))
		return
	}
	// Written from where it was read, as a stream's last bytes are: the
	// budget it holds is given back only once it went (CloseWithError).
	ex.out.bytesOut = 0 // counted again as it goes
	ex.st.tail = body
	ex.serveBody(len(body))
}

// setAttemptsHeader sets x-sturdy-attempts on the client's response: n.
func (ex *exchange) setAttemptsHeader(n int) {
	ex.req.scratch = strconv.AppendInt(ex.req.scratch[:0], int64(n), 10)
	ex.ctx.Response.Header.SetBytesKV(hdrAttempts, ex.req.scratch)
}

// fail answers with an error Sturdy produced itself (see errorTable).
func (ex *exchange) fail(e *apiError) {
	e.details.Attempts = ex.loop.attempts
	if t := ex.target(); t != nil {
		e.details.Upstream = t.up.Name()
	}
	e.details.LastStatus = ex.loop.lastStatus
	e.write(ex.ctx, ex.req.id, ex.req.call.API)
	markCORS(&ex.ctx.Response.Header, &ex.ctx.Request.Header, ex.tbl.corsOrigins)
	ex.out.status, ex.out.errCode = e.spec.status, e.spec.code
	ex.out.bytesOut = int64(len(ex.ctx.Response.Body()))
	if ex.loop.attempts > 0 {
		ex.setAttemptsHeader(ex.loop.attempts)
	}
	ex.out.ttft = time.Since(ex.req.start)
	ex.out.ttfb = ex.out.ttft
}

// obstructed answers when no target could take the request at all: o
// is what stood in the way, the soonest to clear.
func (ex *exchange) obstructed(o obstacle) {
	var e *apiError
	switch o.kind {
	case policy.ObstacleBreaker, policy.ObstacleUnhealthy:
		ex.out.outcome, ex.out.cause = outcomeCircuitOpen, o.cause
		what := fmt.Sprintf("upstream %q", o.upstream)
		if o.limit == "model" && o.kind == policy.ObstacleBreaker {
			what = fmt.Sprintf("model %q on upstream %q", o.model, o.upstream)
		}
		why := "its circuit breaker is open"
		if o.kind == policy.ObstacleUnhealthy {
			why = "no endpoint of it passes its health check"
		}
		if o.cause != "" {
			why += " (" + o.cause + ")"
		}
		e = newError(CodeCircuitOpen, what, why, ex.notes.alsoTried(ex.loop.stop))
	case policy.ObstacleBusy:
		ex.out.outcome = outcomeUpstreamBusy
		e = newError(CodeUpstreamBusy, o.upstream, o.limit, ex.notes.alsoTried(ex.loop.stop))
	default:
		ex.out.outcome = outcomeRateLimited
		ex.report().refused(o.kind)
		e = newError(CodeRateLimited, fmt.Sprintf("upstream %q is rate-limited for this client (%s)%s", o.upstream, o.kind, ex.notes.alsoTried(ex.loop.stop)))
	}
	e.retryAfter = o.wait
	ex.fail(e)
}

// noReply answers when attempts were made but none produced a response;
// last is the last one.
func (ex *exchange) noReply(last *attempt) {
	up, tried := ex.target().up.Name(), ex.notes.text(ex.loop.stop)
	at := ""
	if ep := ex.loop.ep; ep != nil {
		at = " at " + ep.Public() // no credentials
	}
	failed := "could not be reached" + at
	fault := last.out.Fault
	switch fault {
	case policy.FaultReset, policy.FaultStale:
		failed = "closed the connection before responding" + at
	case policy.FaultLocal:
		failed = "could not be reached: Sturdy is out of file descriptors"
	}
	if last.why != "" && fault != policy.FaultLocal {
		failed += " (" + last.why + ")"
	}
	var e *apiError
	switch {
	case ex.loop.stop == policy.StopDeadline || time.Until(ex.req.deadline) <= 0:
		e = newError(CodeDeadlineExceeded, up, tried)
	case fault == policy.FaultTimeout:
		e = newError(CodeUpstreamTimeout, up, tried)
	case ex.loop.attempts > 1:
		e = newError(CodeRetriesExhausted, up, failed, tried)
	default:
		e = newError(CodeUpstreamUnreachable, up, failed, tried)
	}
	ex.out.outcome, ex.out.cause = outcomeUpstreamError, last.why
	ex.fail(e)
}

// text names what was tried: "ollama: 2 attempts, last timeout; …",
// and why retrying stopped (stop).
func (ns *notes) text(stop policy.Stop) string {
	var b strings.Builder
	for i, n := range ns.tried[:ns.nTried] {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(n.upstream)
		if n.model != "" {
			b.WriteString(" as " + n.model)
		}
		switch {
		case n.attempts == 0 && n.result == "":
			b.WriteString(": no attempt")
		case n.attempts == 0:
			b.WriteString(": skipped, " + n.result)
		case n.replays > 0:
			fmt.Fprintf(&b, ": %d attempt%s (%d a stale resend), last %s", n.attempts, plural(n.attempts), n.replays, n.result)
		default:
			fmt.Fprintf(&b, ": %d attempt%s, last %s", n.attempts, plural(n.attempts), n.result)
		}
	}
	if stop.Ended() {
		b.WriteString("; " + stop.Text())
	}
	return b.String()
}

// alsoTried lists the targets tried before an obstacle, if any (stop: why
// retrying stopped).
func (ns *notes) alsoTried(stop policy.Stop) string {
	if ns.nTried <= 1 {
		return ""
	}
	return " (tried " + ns.text(stop) + ")"
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
