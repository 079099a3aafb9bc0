package proxy

import (
	"fmt"
	"time"

	"sturdy/policy"
	"sturdy/upstream"
)

// Token budgets (clients: tokens_per_minute and its input_/output_
// kinds, and a client key's own): a request reserves its estimate
// (policy.EstimateTokens of policy.RequestTokens) of every budget it is
// under once, at admission — refused with 429 rate_limited when one does
// not allow it — and settles each to its reply's usage (meter.go) as it
// ends, or gets it back when no upstream answered it.

// tokenKind is which side of a reply a budget counts.
type tokenKind uint8

const (
	tokensTotal  tokenKind = iota // input and output
	tokensInput                   // input only
	tokensOutput                  // output only
	tokenKinds
)

// names of each kind in a message and an Anthropic header
// (anthropic-ratelimit-<name>-limit).
var tokenKindNames = [tokenKinds]string{"tokens", "input tokens", "output tokens"}
var anthropicTokenHeaders = [tokenKinds]string{"tokens", "input-tokens", "output-tokens"}

// limit is the budget of kind k in t (0: none).
func (t TokenLimits) limit(k tokenKind) int64 {
	return [tokenKinds]int64{t.TokensPerMinute, t.InputTokensPerMinute, t.OutputTokensPerMinute}[k]
}

// keyBudget is one client's token budgets under a clientLimiter: a
// window per kind its entry sets.
type keyBudget [tokenKinds]policy.TokenWindow

func newKeyBudget(t TokenLimits) *keyBudget {
	b := new(keyBudget)
	for k := range tokenKinds {
		b[k].SetLimit(t.limit(k))
	}
	return b
}

// idle reports whether b owes and holds nothing: it may leave the map.
func (b *keyBudget) idle(now time.Time) bool {
	for k := range b {
		if !b[k].Idle(now) {
			return false
		}
	}
	return true
}

// evictScan bounds how many of a full map's oldest budgets a new client
// looks at for one that is idle (one in debt, or with a reservation in
// flight, is never dropped: it goes to the map's front).
const evictScan = 16

// budgetOf is the budgets of the client whose key hash is h, added when
// new; nil when the map is full of budgets none of which (among the
// evictScan oldest) is idle. Under l.mu.
func (l *clientLimiter) budgetOf(h uint64, now time.Time) *keyBudget {
	if b, ok := l.budgets.Get(h); ok {
		return b
	}
	if l.budgets.Len() >= upstream.MaxTrackedKeys {
		for range evictScan {
			k, b, _ := l.budgets.GetOldest()
			if b.idle(now) {
				l.budgets.Remove(k)
				if l.onEvict != nil {
					l.onEvict()
				}
				break
			}
			l.budgets.Get(k) // owes or holds tokens: kept, to the front
		}
		if l.budgets.Len() >= upstream.MaxTrackedKeys {
			return nil
		}
	}
	b := newKeyBudget(l.opts.TokenLimits)
	l.budgets.Add(h, b)
	return b
}

// keepBudgets gives l the budgets of prev, an entry a reload changed,
// when both set some and tell clients apart the same way: what was spent
// and reserved stays, under l's limits (policy.TokenWindow.SetLimit).
func (l *clientLimiter) keepBudgets(prev *clientLimiter) {
	if l.budgets == nil || prev.budgets == nil || prev.opts.KeyHeader != l.opts.KeyHeader {
		return
	}
	prev.mu.Lock()
	defer prev.mu.Unlock()
	for _, h := range prev.budgets.Keys() { // the oldest first: the order stays
		b, _ := prev.budgets.Peek(h)
		for k := range tokenKinds {
			b[k].SetLimit(l.opts.limit(k))
		}
		l.budgets.Add(h, b)
	}
}

// tokenHold is one reservation a request holds until it settles.
type tokenHold struct {
	w        *policy.TokenWindow
	kind     tokenKind
	reserved int64
	// upstream: a target's tokens_per_minute, given back when the request
	// leaves that target (refundUpstream).
	upstream bool
}

// tokenEstimate is what a request reserves: its input, and its output
// (maxOutput: what it asks at most, 0: unsaid).
type tokenEstimate struct {
	chars     int
	maxOutput int64
}

// of is the estimate for a budget of kind k and limit.
func (e tokenEstimate) of(k tokenKind, limit int64) int64 {
	switch k {
	case tokensInput:
		return policy.EstimateTokens(e.chars, 0, 0)
	case tokensOutput:
		return policy.EstimateTokens(0, e.maxOutput, limit)
	}
	return policy.EstimateTokens(e.chars, e.maxOutput, limit)
}

// clientTokens is the clients: token budgets as a hook: a request
// reserves its estimate of each budget it is under (the limits
// clientLimits.each names) at admission, and settles them with its
// summary. Calls that cost no tokens (count_tokens, /v1/models, any
// other than inference) are not charged.
type clientTokens clientLimits

func (cts clientTokens) reserve(ex *exchange, now time.Time) *apiError {
	if !ex.req.call.Charged() {
		return nil
	}
	est := ex.req.estimate(ex.ctx.Request.Body())
	e := clientLimits(cts).each(ex, func(cl *clientLimiter, who string) *apiError {
		if cl.budgets == nil {
			return nil
		}
		return cts.take(ex, cl, est, now, who)
	})
	if e != nil {
		ex.req.refund()
		ex.p.m.RateLimited.WithLabelValues("client_tokens").Inc()
		ex.out.outcome = outcomeRateLimited
		return e
	}
	if len(ex.req.holds) > 0 {
		ex.req.metered = true
		ex.req.needUsage(ex.ctx.Request.Body())
	}
	return nil
}

// needUsage notes that q's reply's usage is needed: for a chat or legacy
// completions stream whose client did not ask for its usage, Sturdy asks
// (bodyFor) the targets that let it (asksUsage).
func (q *outbound) needUsage(body []byte) {
	if api := q.call.API; api == policy.APIChat || api == policy.APICompletions {
		stream, usage := policy.AsksUsage(body)
		q.wantsUsage = stream && !usage
	}
}

// asksUsage reports whether q's attempts on t ask for the stream's usage
// on the client's behalf: the client did not, and t's upstream lets
// Sturdy (stream_usage).
func (q *outbound) asksUsage(t *target) bool { return q.wantsUsage && t.up.Options().AsksStreamUsage() }

// take reserves est of every budget cl sets for ex's client, or none of
// them: the refusal names the budget that did not allow it (who: whose).
func (clientTokens) take(ex *exchange, cl *clientLimiter, est tokenEstimate, now time.Time, who string) *apiError {
	h := credHash(cl.keyOf(&ex.ctx.Request.Header))
	cl.mu.Lock()
	defer cl.mu.Unlock()
	b := cl.budgetOf(h, now)
	if b == nil {
		e := newError(CodeRateLimited, fmt.Sprintf("Sturdy tracks token budgets for as many clients as it holds (%d), each in use",
			upstream.MaxTrackedKeys))
		e.retryAfter = time.Second
		return e
	}
	held := len(ex.req.holds)
	for k := range tokenKinds {
		limit := cl.opts.limit(k)
		if limit <= 0 {
			continue
		}
		n := est.of(k, limit)
		ok, wait := b[k].Reserve(n, now)
		if !ok {
			for _, th := range ex.req.holds[held:] {
				th.w.Refund(th.reserved)
			}
			ex.req.holds = ex.req.holds[:held]
			return tokensRefused(&b[k], k, n, wait, now, who)
		}
		ex.req.holds = append(ex.req.holds, tokenHold{w: &b[k], kind: k, reserved: n})
	}
	return nil
}

// tokensRefused is the answer to a request whose estimate (n) budget w
// of kind k does not allow now: 429 rate_limited with the budget's
// headers and when it will (wait; 0: when the reservations in flight
// settle — a second).
func tokensRefused(w *policy.TokenWindow, k tokenKind, n int64, wait time.Duration, now time.Time, who string) *apiError {
	st := w.State(now)
	e := newError(CodeRateLimited, fmt.Sprintf("%s is out of %s: its budget is %d %s a minute, %d remain (%d held by requests in flight), this request needs an estimated %d",
		who, tokenKindNames[k], st.Limit, tokenKindNames[k], max(st.Remaining, 0), st.Reserved, n))
	e.retryAfter = max(wait, time.Second)
	e.tokens = tokenHeaders{kind: k, state: st, set: true}
	return e
}

// refundUpstream gives back what the request reserved of a target's
// tokens_per_minute: it leaves that target.
func (q *outbound) refundUpstream() {
	kept := q.holds[:0]
	for _, th := range q.holds {
		if th.upstream {
			th.w.Refund(th.reserved)
			continue
		}
		kept = append(kept, th)
	}
	q.holds = kept
}

// estimate is what q reserves of a budget: its text and the output it
// asks at most, read from its body once.
func (q *outbound) estimate(body []byte) tokenEstimate {
	if !q.estimated {
		q.est.chars, q.est.maxOutput = policy.RequestTokens(q.call.API, body)
		q.estimated = true
	}
	return q.est
}

func (q *outbound) refund() {
	for _, th := range q.holds {
		th.w.Refund(th.reserved)
	}
	q.holds = q.holds[:0]
}

// settle: the budgets are settled with every hold (settleHolds).
func (clientTokens) settle(*exchange, summary) {}

// settleHolds settles every reservation ex holds — a client's budgets, a
// target's tokens_per_minute — with its summary s, as it ends.
func settleHolds(ex *exchange, s *summary) {
	q := &ex.req
	if len(q.holds) == 0 {
		return
	}
	u, used := settledUsage(ex, s)
	now := time.Now()
	for _, th := range q.holds {
		switch {
		case !used:
			th.w.Refund(th.reserved)
		case th.kind == tokensInput:
			th.w.Settle(th.reserved, u.Input, now)
		case th.kind == tokensOutput:
			th.w.Settle(th.reserved, u.Output, now)
		default:
			th.w.Settle(th.reserved, u.Input+u.Output, now)
		}
	}
	q.holds = q.holds[:0]
}

// settledUsage is what a finished request is charged: its reply's usage
// where it told it; for a reply that did not (a stream cut before its
// usage, a server that reports none), its input estimate and the output
// it sent (characters ÷ 4); used false — a refund — when nothing was
// (Sturdy answered itself, the client left before an answer, an
// upstream's error that tells no usage).
func settledUsage(ex *exchange, s *summary) (u policy.Usage, used bool) {
	if s.errCode != "" && !s.streaming { // Sturdy answered itself: nothing reached the client
		return u, false
	}
	if s.usage.Known {
		return s.usage.Usage, true
	}
	if s.usage.streamed == 0 && (s.status < 200 || s.status >= 300) {
		return u, false
	}
	est := ex.req.estimate(ex.ctx.Request.Body())
	return policy.Usage{Input: est.of(tokensInput, 0), Output: s.usage.streamed}, true
}
