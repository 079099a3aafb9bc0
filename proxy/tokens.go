package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync/atomic"
	"time"

	"sturdy/fleet"
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

// keyBudget is one client's token budgets under a clientLimiter: a
// window per kind its entry sets, and the client's id as /debug/clients
// shows it (its key's SHA-256, the first 12 hex digits).
type keyBudget struct {
	w     [tokenKinds]policy.TokenWindow
	spent spent
	id    string
	// src is the source of a client not authenticated (sourceOf), which
	// counts it against MaxBudgetsPerSource; 0 for one authenticated.
	src uint64
}

func newKeyBudget(t TokenLimits, key []byte) *keyBudget {
	sum := sha256.Sum256(key)
	b := &keyBudget{id: hex.EncodeToString(sum[:6])}
	for k := range tokenKinds {
		b.w[k].SetLimit(t.limit(k))
	}
	return b
}

// idle reports whether b owes and holds no tokens, so it may leave the
// map. What it spent (a spend budget) does not keep it: a client whose
// spend is forgotten may spend again — with shared_state its spend is
// the fleet's, and nothing is lost — where keeping every client that
// spent this day would shut new clients out until the day's end.
func (b *keyBudget) idle(now time.Time) bool {
	for k := range b.w {
		if !b.w[k].Idle(now) {
			return false
		}
	}
	return true
}

// evictScan bounds how many of a full map's oldest budgets a new client
// looks at for one that is idle (one in debt, or with a reservation in
// flight, is never dropped: it goes to the map's front).
const evictScan = 16

// budgetOf is the budgets of the client whose key hash is h (id: the
// key /debug/clients names it by), added when
// new; nil when the map is full of budgets none of which (among the
// evictScan oldest) is idle. Under l.mu.
func (l *clientLimiter) budgetOf(h uint64, id []byte, src uint64, now time.Time) (b *keyBudget, full string) {
	if b, ok := l.budgets.Get(h); ok {
		return b, ""
	}
	if src != 0 && l.bySource[src] >= MaxBudgetsPerSource {
		return nil, fmt.Sprintf("Sturdy tracks token budgets for as many clients from one address as it may (%d) for "+
			"clients it does not authenticate (auth.keys)", MaxBudgetsPerSource)
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
			return nil, fmt.Sprintf("Sturdy tracks token budgets for as many clients as it holds (%d), each in use", upstream.MaxTrackedKeys)
		}
	}
	b = newKeyBudget(l.opts.TokenLimits, id)
	if b.src = src; src != 0 {
		l.bySource[src]++
	}
	l.budgets.Add(h, b)
	return b, ""
}

// tokenHold is one reservation a request holds until it settles: of a
// local window (w), or of the fleet's budget (fleet, fh) when
// shared_state is set.
type tokenHold struct {
	// w is the local window: the hold's, or for a fleet's hold the one
	// that keeps this replica's spend for when Redis is down.
	w        *policy.TokenWindow
	fleet    *atomic.Pointer[shared]
	fh       fleet.TokenHold
	kind     tokenKind
	reserved int64
	// upstream: a target's tokens_per_minute, given back when the request
	// leaves that target (refundUpstream).
	upstream bool
}

// settle turns the hold into used tokens spent now; a fleet's, through
// the fleet's link as it is now (a reload may have replaced the one it
// was reserved through; with shared_state off, it lapses in Redis).
func (th tokenHold) settle(used int64, now time.Time) {
	switch {
	case th.fleet != nil:
		if f := th.fleet.Load(); f != nil {
			f.st.SettleTokens(th.fh, used)
		}
		if th.w != nil && !now.IsZero() { // this replica's spend, the last known window when Redis goes
			th.w.Settle(0, used, now)
		}
	case now.IsZero():
		th.w.Refund(th.reserved)
	default:
		th.w.Settle(th.reserved, used, now)
	}
}

// refund gives the hold back.
func (th tokenHold) refund() { th.settle(0, time.Time{}) }

// reserveBudget reserves n tokens of a budget of limit a minute (of kind
// k; upstream: a target's) for q: the fleet's, named name, when f (link's
// as the caller loaded it) is set (shared_state), else — or when Redis does not answer and on_failure is
// local, the limit divided by the replicas the fleet last counted — the
// local window w. Taken, the hold is q's; not, wait is when it would be
// (0: when reservations in flight settle) and st the budget as it stands;
// refused says what Redis did when it did not answer and on_failure is
// refuse.
func (q *outbound) reserveBudget(link *atomic.Pointer[shared], f *shared, name string, w *policy.TokenWindow, k tokenKind,
	limit, n int64, upstream bool, now time.Time) (taken bool, wait time.Duration, st policy.TokenState, refused string) {
	div := int64(1)
	if f != nil {
		switch r := f.reserveTokens(name, limit, n); {
		case r.refused:
			return false, 0, st, r.why
		case !r.local && r.taken:
			q.holds = append(q.holds, tokenHold{w: w, fleet: link, fh: r.hold, kind: k, reserved: n, upstream: upstream})
			return true, 0, st, ""
		case !r.local:
			return false, r.wait, policy.TokenState{Limit: limit, Remaining: r.remaining, Reserved: r.reserved, Reset: r.wait}, ""
		}
		div = f.st.Replicas()
	}
	w.SetLimit(max(limit/div, 1))
	if ok, wait := w.Reserve(n, now); !ok {
		return false, wait, w.State(now), ""
	}
	q.holds = append(q.holds, tokenHold{w: w, kind: k, reserved: n, upstream: upstream})
	return true, 0, st, ""
}

// tokenEstimate is what a request reserves: its input, and its output
// (maxOutput: what it asks at most, 0: unsaid).
type tokenEstimate struct {
	textBytes int
	maxOutput int64
}

// of is what a request reserves of a budget of kind k and limit: its
// estimate, at most half the window (policy.Reservation).
func (e tokenEstimate) of(k tokenKind, limit int64) int64 {
	var n int64
	switch k {
	case tokensInput:
		n = policy.EstimateTokens(e.textBytes, 0, 0)
	case tokensOutput:
		n = policy.EstimateTokens(0, e.maxOutput, limit)
	default:
		n = policy.EstimateTokens(e.textBytes, e.maxOutput, limit)
	}
	return policy.Reservation(n, limit)
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
		ex.req.spenders = ex.req.spenders[:0]
		reason := "client_tokens"
		if e.spec.code == CodeBudgetExceeded {
			reason = "client_spend"
		}
		ex.p.m.RateLimited.WithLabelValues(reason).Inc()
		if ex.out.outcome == "" || ex.out.outcome == outcomeRejected {
			ex.out.outcome = outcomeRateLimited
		}
		return e
	}
	if len(ex.req.holds) > 0 || len(ex.req.spenders) > 0 {
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
	key := cl.keyOf(&ex.ctx.Request.Header) // by credential: the key itself, as client_keys_file names it by its SHA-256
	h, id := credHash(key), key
	var src uint64
	if !authenticated(ex.tbl, ex.req.key) {
		src = sourceOf(ex.ctx, ex.tbl)
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	b, full := cl.budgetOf(h, id, src, now)
	if b == nil {
		e := newError(CodeRateLimited, full)
		e.retryAfter = time.Second
		return e
	}
	f := ex.p.fleet.Load()
	if cl.opts.Spend.USD > 0 {
		name := ""
		if f != nil {
			name = f.clientBudgetName(cl, tokenKinds, key) // the kind past the token budgets': spend
		}
		if e := takeSpend(ex, &b.spent, cl.opts.Spend, f, name, now, who); e != nil {
			return e
		}
	}
	held := len(ex.req.holds)
	for k := range tokenKinds {
		limit := cl.opts.limit(k)
		if limit <= 0 {
			continue
		}
		n, name := est.of(k, limit), ""
		if f != nil {
			name = f.clientBudgetName(cl, k, key)
		}
		ok, wait, st, refused := ex.req.reserveBudget(&ex.p.fleet, f, name, &b.w[k], k, limit, n, false, now)
		if !ok {
			for _, th := range ex.req.holds[held:] {
				th.refund()
			}
			ex.req.holds = ex.req.holds[:held]
			if refused != "" {
				ex.out.outcome = outcomeSharedState
				return sharedFailure(refused)
			}
			return tokensRefused(st, k, n, wait, who)
		}
	}
	return nil
}

// tokensRefused is the answer to a request whose estimate (n) a budget
// of kind k, standing at st, does not allow now: 429 rate_limited with
// the budget's headers and when it will (wait; 0: when the reservations
// in flight settle — a second).
func tokensRefused(st policy.TokenState, k tokenKind, n int64, wait time.Duration, who string) *apiError {
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
			th.refund()
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
		q.est.textBytes, q.est.maxOutput = policy.RequestTokens(q.call.API, body)
		q.estimated = true
	}
	return q.est
}

func (q *outbound) refund() {
	for _, th := range q.holds {
		th.refund()
	}
	q.holds = q.holds[:0]
}

// settle settles everything ex reserved — a client's token budgets, a
// target's tokens_per_minute (holds), its spend budgets (settleSpend) —
// with its summary s, as it ends: to what it is charged (s.charged), or
// given back.
func settle(ex *exchange, s *summary) {
	settleSpend(ex, s)
	q := &ex.req
	if len(q.holds) == 0 {
		return
	}
	u, used := s.charged, s.chargedAny
	now := time.Now()
	for _, th := range q.holds {
		switch {
		case !used:
			th.refund()
		case th.kind == tokensInput:
			th.settle(u.Input, now)
		case th.kind == tokensOutput:
			th.settle(u.Output, now)
		default:
			th.settle(u.Input+u.Output, now)
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
