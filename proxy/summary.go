package proxy

import (
	"time"

	"go.opentelemetry.io/otel/trace"

	"sturdy/metrics"
	"sturdy/policy"
	"sturdy/upstream"
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
	// waits is the time waited by source (the notes').
	waits waits
	// clientKey is its client key's name (client_keys_file), if it has one.
	clientKey string
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
	// usage is the answer's model and tokens, as metered (meter.go) for
	// a request whose usage something needs (outbound.metered); its
	// Known says whether the reply told them.
	usage usage
	// model is the model as sent, as a metric label (table.modelLabel),
	// when its usage was read; charged what it is charged (settledUsage:
	// chargedAny false, nothing: a refund), cost what that costs at the
	// table's prices, in USD.
	model      string
	charged    policy.Usage
	chargedAny bool
	cost       float64
}

// read reads the finished request ex into s.
func (s *summary) read(ex *exchange) {
	lp, out, n, rs := &ex.loop, &ex.out, &ex.notes, &ex.st.rescue
	*s = summary{id: ex.req.id, method: ex.ctx.Method(), path: rawPath(ex.ctx.Request.Header.RequestURI()), api: ex.req.call.API,
		status: out.status, outcome: out.outcome, errCode: out.errCode, stop: lp.stop, attempts: lp.attempts,
		streaming: out.streaming, bytesOut: out.bytesOut, ttfb: out.ttfb, ttft: out.ttft, dur: time.Since(ex.req.start),
		targets: n.tried[:n.nTried], retries: n.retries[:n.nRetries], waits: n.waits,
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
	if k := ex.req.key; k != nil {
		s.clientKey = k.name
	}
	if out.outcome == outcomeClientGone {
		s.gonePhase = phase(ex.client.gonePhase.Load())
	}
	if ex.req.metered {
		s.usage = meteredUsage(ex)
		s.charged, s.chargedAny = settledUsage(ex, s)
		if s.answered != nil {
			sent := s.answered.sent(ex.req.model)
			s.model = ex.tbl.modelLabel(sent)
			if s.chargedAny && len(ex.tbl.prices) > 0 {
				s.cost = ex.tbl.prices.cost(sent, s.charged)
			}
		}
	}
}

// report is where the loop's steps say what happened, each event once:
// it goes to the access line's notes (n), the metrics (m) and the
// request's trace (tr) from here, so the steps read as decisions. route
// is the request's route's name (its series).
type report struct {
	n     *notes
	m     *metrics.Metrics
	tr    *traceState
	route string
}

// passedOver: the loop passed t over, its upstream speaking another API
// (apis).
func (r report) passedOver(t *target) {
	r.n.target(t.up.Name(), "")
	r.n.result(resultUnsupportedAPI, false)
}

// visiting: the loop begins a visit of t.
func (r report) visiting(t *target) { r.n.target(t.up.Name(), t.model) }

// failedOver: the loop leaves t for the route's next target.
func (r report) failedOver(t *target) { r.m.Failovers.WithLabelValues(r.route, t.up.Name()).Inc() }

// attemptStarted: attempt a of request q (method) is sent.
func (r report) attemptStarted(q *outbound, method []byte, a *attempt) {
	r.tr.startAttempt(q, method, a)
}

// attemptEnded: attempt a ended (its breakers told) — the attempts
// metric, the note of its target, and its span's result.
func (r report) attemptEnded(a *attempt) {
	result := a.verdict.Label()
	a.ep.CountAttempt(a.up.Name(), result)
	n := r.n
	n.result(result, true)
	if n.nTried > 0 {
		n.tried[n.nTried-1].endpoint = a.ep.Addr()
		if a.stale {
			n.tried[n.nTried-1].replays++
		}
	}
	r.tr.attemptDone(a)
}

// decided: policy chose d after an attempt; failoverBy says what of a
// pass-through reply it failed over on ("" for none).
func (r report) decided(d policy.Decision, failoverBy string) {
	if d.Action == policy.ActionFailover && failoverBy != "" {
		r.n.result(failoverBy, false) // not passed through: the client never saw it
	}
	r.tr.attemptDecided(d)
}

// retried: a retry on up after a failure (reason) on endpoint ep, once
// its wait (d.Wait, set by d.Source) is over.
func (r report) retried(up *upstream.Upstream, reason policy.Reason, ep *upstream.Endpoint, d policy.Decision) {
	if !d.Replay && !d.Ride {
		r.m.RetryWait.WithLabelValues(up.Name(), d.Source.String()).Observe(d.Wait.Seconds())
	}
	r.m.Retries.WithLabelValues(up.Name(), reason.String()).Inc()
	if n := r.n; n.nRetries < maxLoggedRetries {
		n.retries[n.nRetries] = retryNote{reason: reason, endpoint: ep.Addr(), wait: d.Wait}
		n.nRetries++
	}
}

// skipped: obstacle o kept the loop from its target.
func (r report) skipped(o obstacle) {
	r.m.TargetSkips.WithLabelValues(o.upstream, o.kind.String()).Inc()
	n := r.n
	n.result(o.kind.String(), false)
	if o.kind == policy.ObstacleBreaker && n.nTried > 0 {
		n.tried[n.nTried-1].breaker = o.limit
	}
}

// budgetSpent: up's retry budget refused a retry.
func (r report) budgetSpent(up *upstream.Upstream) {
	r.m.BudgetExhausted.WithLabelValues(up.Name()).Inc()
}

// cooledDown: a reply put up in cooldown.
func (r report) cooledDown(up *upstream.Upstream) { r.m.Cooldowns.WithLabelValues(up.Name()).Inc() }

// riding: the request begins riding through an outage of up.
func (r report) riding(up *upstream.Upstream) { r.m.RideThroughs.WithLabelValues(up.Name()).Inc() }

// waiting: the request waits d in phase in, set by source.
func (r report) waiting(in phase, d time.Duration, source waitSource) {
	r.n.waits[source] += max(d, 0)
	r.tr.wait(in, d, source)
}

// queueing: the request joins a queue (a max_in_flight slot, a
// connection place, a concurrency place); it returns when, for queued.
func (r report) queueing() time.Time { return time.Now() }

// queued: the queue joined at start ended with res (source: whose); it
// returns how long it waited.
func (r report) queued(start time.Time, res upstream.LeaseResult, source waitSource) time.Duration {
	if res == upstream.LeaseTaken {
		return 0
	}
	d := time.Since(start)
	r.n.waits[source] += d
	r.tr.queued(start, d, source)
	return d
}

// committed: the response began at at (streaming: relayed as it comes).
func (r report) committed(at time.Time, streaming bool) {
	if streaming {
		r.m.OpenStreams.Inc() // taken off as the request is measured
	}
	r.tr.committed(at, streaming)
}

// refused: the request is refused as rate-limited, for kind.
func (r report) refused(kind policy.Obstacle) { r.m.RateLimited.WithLabelValues(kind.String()).Inc() }

// unterminated: a framed stream ended cleanly without its terminator.
func (r report) unterminated() { r.m.StreamsUnterminated.WithLabelValues(r.route).Inc() }

// cut: the stream failed mid-answer (err: how, if known); its
// attempt's span ends.
func (r report) cut(err error) { r.tr.attemptCut(err) }

// continuationFailed: a continuation's attempt failed (its span said
// how); its span ends.
func (r report) continuationFailed() { r.tr.endAttempt() }

// concurrencyQueued: a request of class pr asked for a place on an
// endpoint of up with a concurrency limit, with result res after waiting
// waited; shed
// says that limit's queue turned it away. A wait is observed, a
// refusal counted.
func (r report) concurrencyQueued(up *upstream.Upstream, pr upstream.Priority, waited time.Duration, res upstream.LeaseResult, shed bool) {
	if res == upstream.LeaseWaited || shed {
		r.m.ConcurrencyWait.WithLabelValues(up.Name()).Observe(waited.Seconds())
	}
	if shed {
		r.m.ConcurrencyShed.WithLabelValues(up.Name(), pr.String()).Inc()
	}
}

// rescued: a cut stream's rescue came to result (continued, failed, or
// why it was refused); counted says it counts in the metric.
func (r report) rescued(result string, counted bool) {
	if counted {
		r.m.StreamRescues.WithLabelValues(result).Inc()
	}
	r.tr.rescueResult(result)
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
