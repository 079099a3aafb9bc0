package proxy

import (
	"fmt"
	"time"

	"github.com/valyala/fasthttp"
)

// hook is a request-level step before the attempt loop: reserve runs at
// admission (an error refuses the request: it is the client's answer).
// What a hook reserves that the request's end must settle is the
// request's own, as data (outbound.holds, spenders: settle, tokens.go),
// settled once with the target's tokens_per_minute, whichever reserved
// it. The clients: limits are the first; the token budgets the second;
// an admission queue is another row of table.hooks, not another step in
// the loop.
type hook interface {
	reserve(ex *exchange, now time.Time) *apiError
}

func (cls clientLimits) reserve(ex *exchange, now time.Time) *apiError {
	return cls.each(ex, func(cl *clientLimiter, who string) *apiError { return cls.take(ex, cl, now, who) })
}

// take takes one request from limit cl for ex, or refuses it (who names
// whose limit it is in the message).
func (clientLimits) take(ex *exchange, cl *clientLimiter, now time.Time, who string) *apiError {
	if cl.opts.RequestsPerSecond <= 0 { // an entry of token budgets only
		return nil
	}
	wait, ok, e := takeClient(ex.p, &ex.ctx.Request.Header, cl, now)
	switch {
	case e != nil:
		ex.out.outcome = outcomeSharedState
		return e
	case !ok:
		ex.p.m.RateLimited.WithLabelValues("client").Inc()
		ex.out.outcome = outcomeRateLimited
		e := newError(CodeRateLimited, fmt.Sprintf("%s is over its limit of %g requests per second (by %s)",
			who, cl.opts.RequestsPerSecond, cl.opts.KeyHeader))
		e.retryAfter = wait
		return e
	}
	return nil
}

// hooks are a table's hooks, in the order they reserve.
type hooks []hook

// reserve runs the hooks' reserve for ex in order, stopping at the first
// refusal.
func (hs hooks) reserve(ex *exchange, now time.Time) *apiError {
	for _, h := range hs {
		if e := h.reserve(ex, now); e != nil {
			return e
		}
	}
	return nil
}

// takeClient spends one request of this client's `clients:` limit cl:
// the fleet's when shared_state is set, else (or when Redis does not
// answer and on_failure is local) this replica's own. e is the refusal
// when Redis does not answer and on_failure is refuse.
func takeClient(p *Proxy, h *fasthttp.RequestHeader, cl *clientLimiter, now time.Time) (wait time.Duration, ok bool, e *apiError) {
	key := cl.keyOf(h)
	f := p.fleet.Load()
	if f == nil {
		wait, ok = cl.take(key, now)
		return wait, ok, nil
	}
	switch sl := f.reserve(f.clientLimitName(cl, key), cl.opts.RequestsPerSecond, cl.opts.Burst, 0); {
	case sl.refused:
		return 0, false, sharedFailure(sl.why)
	case !sl.local:
		return sl.wait, sl.taken, nil
	}
	wait, ok = cl.take(key, now)
	return wait, ok, nil
}
