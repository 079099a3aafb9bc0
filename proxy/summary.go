package proxy

import (
	"time"

	"go.opentelemetry.io/otel/trace"

	"sturdy/policy"
)

// summary is what a finished request was, read off the exchange once as
// it ends (read): the access line, the trace's server span and the
// metrics are formatters of it (its logAccess and measure,
// traceState.end), none of them reading the exchange's state again. It lives on finish's stack;
// its strings and slices alias the exchange's, valid until the exchange
// is reset.
type summary struct {
	// id, method and path are the request's own (path without its
	// query); api the API its path speaks.
	id, method, path []byte
	api              policy.API
	// route, upstream and endpoint name where it went ("" for a request
	// refused before routing; endpoint "" when no attempt was made);
	// breaker and modelBreaker are their states as it ends.
	route, upstream, endpoint string
	breaker, modelBreaker     string
	// status and outcome are what the client got, errCode Sturdy's own
	// error code (if it answered itself), stop why the loop stopped,
	// cause what a breaker or a connection failure said (for
	// upstream_error and circuit_open).
	status          int
	outcome         string
	errCode         string
	stop            policy.Stop
	cause           string
	gonePhase       phase
	attempts        int
	streaming       bool
	bytesOut        int64
	ttfb, ttft, dur time.Duration
	// targets and retries are the notes: each target with its attempts,
	// each retry with its reason.
	targets []targetNote
	retries []retryNote
	// rescue is what became of a stream cut mid-answer.
	rescueTries, rescued int
	rescuedBy, refused   string
	seam                 int64
	// rt is the route it took (nil: refused before routing), answered the
	// target it went to last, whose reply a committed answer is (the
	// route's common series).
	rt       *route
	answered *target
	// traceID is its trace's id, when traced.
	traceID trace.TraceID
	traced  bool
	// usage is the answer's model and tokens, read from what was relayed
	// when it was kept (a traced request: keepTail) or from a reply set
	// whole; its known says whether the reply told them.
	usage usage
}

// read reads the finished request ex into s.
func (s *summary) read(ex *exchange) {
	lp, out, n, rs := &ex.loop, &ex.out, &ex.notes, &ex.st.rescue
	*s = summary{id: ex.req.id, method: ex.ctx.Method(), path: rawPath(ex.ctx.Request.Header.RequestURI()), api: ex.req.call.API,
		status: out.status, outcome: out.outcome, errCode: out.errCode, stop: lp.stop, attempts: lp.attempts,
		streaming: out.streaming, bytesOut: out.bytesOut, ttfb: out.ttfb, ttft: out.ttft, dur: time.Since(ex.req.start),
		targets: n.tried[:n.nTried], retries: n.retries[:n.nRetries],
		rescueTries: rs.tries, rescued: rs.rescued, rescuedBy: rs.by, refused: rs.refused, seam: rs.seam}
	s.traceID, s.traced = ex.tr.traceID()
	if r := ex.req.route; r != nil {
		t := &r.targets[lp.ti] // where it went: its reply's, once committed (commit, continueOn)
		s.rt, s.route, s.upstream, s.answered = r, r.name, t.up.Name(), t
		if ep := lp.ep; ep != nil {
			s.endpoint, s.breaker, s.modelBreaker = ep.Addr(), ep.Breaker().State().String(), ep.ModelBreakerState(t.sent(ex.req.model))
		} else {
			s.breaker = t.up.State().String()
		}
	}
	s.cause = out.cause
	if out.outcome == outcomeClientGone {
		s.gonePhase = phase(ex.client.gonePhase.Load())
	}
	if ex.tr != nil && ex.tr.rec {
		body := ex.tr.tail // what was relayed: a stream, or a body read whole (an HTTP/1.0 client's)
		if len(body) == 0 && !out.reader && ex.loop.lastStatus != 0 {
			body = ex.ctx.Response.Body() // a reply set whole (never a body stream: Body would read it)
		}
		s.usage = usageOf(body)
	}
}

// ended reports attempt a once, as it ends (its breakers told): the
// attempts metric, the access line's note of its target (in n), and its
// span's result (tr.attemptDone).
func (a *attempt) ended(n *notes, tr *traceState) {
	result := a.verdict.Label()
	a.ep.CountAttempt(a.up.Name(), result)
	n.result(result, true)
	if n.nTried > 0 {
		n.tried[n.nTried-1].endpoint = a.ep.Addr()
		if a.stale {
			n.tried[n.nTried-1].replays++
		}
	}
	tr.attemptDone(a)
}

// target notes a target the request goes to, with the model as sent
// there ("" for the client's).
func (ns *notes) target(upstream, model string) {
	if ns.nTried < maxLoggedTargets {
		ns.tried[ns.nTried] = targetNote{upstream: upstream, model: model}
		ns.nTried++
	}
}

// result records how the current target's last attempt ended, or, with
// attempted false, why it was skipped.
func (ns *notes) result(result string, attempted bool) {
	if ns.nTried > 0 {
		n := &ns.tried[ns.nTried-1]
		if attempted {
			n.attempts++
		}
		n.result = result
	}
}
