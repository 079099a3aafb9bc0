package proxy

import (
	"slices"
	"time"
	"unsafe"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"sturdy/breaker"
	"sturdy/fleet"
	"sturdy/policy"
	"sturdy/upstream"
)

// run is the attempt loop. It walks the route's targets in order and on
// each carries out policy's decisions — wait, attempt, fail over, stop —
// with each try in last (the last one made, once it stops) and what
// stood in the way of the targets in in: what the client is answered
// from (respond). One deadline and max_total_attempts span all targets.
func (ex *exchange) run(last *attempt, in *obstruction) {
	r := ex.req.route
	for i := range r.targets {
		t := &r.targets[i]
		if !t.up.Options().APIs.Serves(ex.req.call.API) { // passed over: it speaks another API (apis)
			ex.report().passedOver(t)
			continue
		}
		if ex.onTarget(t, i, last, in) != policy.ActionFailover || !r.fallbackAfter(ex.req.call.API, i) {
			break
		}
		ex.report().failedOver(t)
	}
}

// obstruction is what stood in the way of a loop's targets, for the
// answer when no attempt produced one (respond): the soonest-clearing
// obstacle, whether the loop's last step was such a refusal (blocked),
// and, when set, what Redis did instead of answering a shared limit
// (on_failure: refuse). Each visit carries it on (visit.in).
type obstruction struct {
	obstacle      obstacle
	blocked       bool
	sharedRefused string
}

// onTarget runs attempts on t, each in a, until policy says to fail over
// or to stop, and returns which; what stood in the way of the targets so
// far is in, and what stands in t's goes there too.
func (ex *exchange) onTarget(t *target, ti int, a *attempt, in *obstruction) policy.Action {
	v := &ex.visit // not on the stack (exchange.visit); cleared, then set: a literal would be built on it
	*v = visit{}
	v.ex, v.t, v.ti, v.in = ex, t, ti, *in
	act := v.run(a)
	*in = v.in
	return act
}

// run is onTarget's visit: its attempts, each in a, until policy says
// to fail over or to stop.
func (v *visit) run(a *attempt) policy.Action {
	ex, t := v.ex, v.t
	if act := v.useTarget(); act != policy.ActionAttempt {
		return act
	}
	for {
		if act := v.attemptOn(a); act != policy.ActionAttempt {
			return act
		}
		d := v.decide(a)
		if d.Action == policy.ActionStop && d.Stop == policy.StopBreakerOpen {
			v.allOut("") // what the client is told: the breaker that is open
		}
		if d.Action != policy.ActionAttempt {
			return v.carry(d)
		}
		if d.Ride && !v.startRide() {
			return v.carry(policy.Decision{Action: policy.ActionStop, Stop: policy.StopUnavailable}) // no place to wait in
		}
		ex.client.enter(phaseBackoff)
		source := sourceSturdy
		switch {
		case d.Source == policy.WaitServer:
			ex.client.enter(phaseRetryAfter)
			source = sourceServer
		case d.Ride:
			ex.client.enter(phaseRideThrough)
			source = sourceRideThrough
		}
		if !v.wait(d.Wait, source) {
			if d.SpendsBudget() {
				t.up.Budget().Cancel(v.reservedAt) // never sent
			}
			return policy.ActionStop
		}
		v.retrying(a, d)
	}
}

// visit is the loop's stay on one target, from useTarget to its failover
// or stop: what it has learned there and is asked of again (the attempts
// on it, its cooldown and affinity keys, the endpoints that failed, a
// ride through its outage). It is the exchange's (exchange.visit, set by
// onTarget, then by a rescue's continueOn once the loop is over), not on
// the stack of the step that runs it; what the request holds of the target (its
// slot, its in-flight count, a riders' place) is the exchange's, given
// back by leaveTarget.
type visit struct {
	// t is its target, ti its index in the route; model the model as sent
	// there (its breaker and cooldown scope).
	t     *target
	ti    int
	model string
	// own is the cooldown this request's own 429 there started with the
	// wait it asked for, which that request's retry is not held by.
	own ownCooldown
	// ex is the request the visit is made for.
	ex *exchange
	// in is what stood in the way of its loop's targets, this one's
	// included (its loop's obstruction, carried from visit to visit).
	in obstruction
	n  int // attempts on it, a stale replay sharing its attempt's number
	// replaying is set while the next attempt is a stale replay;
	// reriding while it follows a ride-through probe that could not
	// connect.
	replaying, reriding bool
	// tokensHeld says it holds its target's tokens_per_minute
	// reservation (reserveTokens).
	tokensHeld bool
	// continuing says its attempts carry a rescue's continuation: paid
	// for from the retry budget (rescueStream), so its first attempt is
	// not one the budget counts.
	continuing bool
	// reservedAt is when the retry budget was taken for the retry being
	// waited for, to give it back if the wait ends early.
	reservedAt time.Time
	// coolKey keys its cooldowns (with the model as sent), once computed;
	// coolDigest is the fleet's key for them.
	coolKey    uint64
	coolDigest fleet.Key
	coolKnown  bool
	// aimed is the endpoint the request's URI and Host are built for;
	// tried the endpoints a retryable attempt failed on (retries go
	// elsewhere).
	aimed  *upstream.Endpoint
	tried  [maxTriedEndpoints]*upstream.Endpoint
	nTried int
	// affKey is the request's affinity key, once computed (affKnown);
	// hasKey says it has one.
	affKey           uint64
	affKnown, hasKey bool
	// rideUntil ends the wait for an endpoint to come back (ride_through;
	// zero: not riding); rideDraw spreads the riders' release.
	rideUntil time.Time
	rideDraw  float64
	// queuedAt is when it began waiting for its max_in_flight slot, until
	// its first attempt has a place: the two waits share one
	// queue_timeout.
	queuedAt time.Time
}

// resultUnsupportedAPI is a target's result in the access log when the
// request's API is not among its upstream's apis.
const resultUnsupportedAPI = "unsupported_api"

// useTarget makes t the current target, begun as visit v: it takes a
// max_in_flight slot (waiting up to queue_timeout) and rebuilds the
// request's target-specific parts (URL, credentials, model).
func (v *visit) useTarget() policy.Action {
	ex, t := v.ex, v.t
	ex.loop.leaveTarget()
	ex.req.refundUpstream() // the target it leaves does not answer it
	lp := &ex.loop
	lp.ti, lp.ep = v.ti, nil
	ex.report().visiting(t)
	if t.up.Limited() {
		ex.client.enter(phaseQueue)
		start := ex.report().queueing()
		r := t.up.TakeSlot(v.leaseRequest())
		ex.report().queued(start, r, sourceInFlight)
		v.queuedAt = start
		switch r {
		case upstream.LeaseTimedOut:
			return v.carry(v.clear(policy.ObstacleBusy, time.Second, 0, "max_in_flight"))
		case upstream.LeaseCancelled:
			return v.interrupted()
		}
		lp.slot = t.up
	}
	t.up.Enter()
	lp.entered = t.up

	q := &ex.req
	ex.setCredential(t.up)
	v.model = t.sent(ex.req.model)
	q.msg.SetBodyRaw(ex.bodyFor(t))
	return policy.ActionAttempt
}

// bodyFor returns the request body as target t gets it: the client's,
// with "model" rewritten (into the request's own buffer) when t sets one,
// and stream_options.include_usage set when Sturdy asks t for a stream's
// usage (asksUsage). Only those values change; every other byte stays.
func (ex *exchange) bodyFor(t *target) []byte {
	q, body := &ex.req, ex.ctx.Request.Body()
	model, usage := t.model != "" && q.model != t.model, q.asksUsage(t)
	if !model && !usage {
		return body
	}
	b := append(q.body[:0], body...)
	if model {
		if rewritten, err := sjson.SetBytes(b, "model", t.model); err == nil {
			b = rewritten
		}
	}
	if usage {
		if rewritten, err := sjson.SetBytes(b, "stream_options.include_usage", true); err == nil {
			b = rewritten
		}
	}
	q.body = b
	return b
}

// aim points the request at ep: its URI (and, for an address found in
// DNS, its Host), unless it already is (on this visit).
func (v *visit) aim(ep *upstream.Endpoint) {
	ex := v.ex
	q := &ex.req
	if v.aimed == ep {
		return
	}
	v.aimed = ep
	q.uri = append(append(q.uri[:0], ep.Base()...), ex.ctx.Request.Header.RequestURI()...)
	q.msg.SetRequestURIBytes(q.uri)
	host := ep.Host()
	q.msg.UseHostHeader = host != nil
	if host != nil {
		q.msg.Header.SetHostBytes(host)
	}
}

// gate clears the way for one attempt on v's target: a cooldown learned
// from a 429 for this request's credential, then pacing. It waits where
// policy says to; otherwise it returns the failover or stop policy chose.
// Its tokens_per_minute is reserved after the queue (attemptOn).
func (v *visit) gate() policy.Action {
	ex := v.ex
	up, now := v.t.up, time.Now()
	if left := v.cooldownLeft(now); left > 0 && !v.ownRetry() {
		d := v.clear(policy.ObstacleCooldown, left, ex.req.retry.MaxRetryAfter, "")
		if d.Action != policy.ActionAttempt {
			return v.carry(d)
		}
		ex.client.enter(phaseCooldown)
		if !v.wait(d.Wait, sourceCooldown) {
			return policy.ActionStop
		}
		now = time.Now()
	}
	if lim, _ := up.Pacing(); lim != nil {
		if a := v.pace(now); a != policy.ActionAttempt {
			return a
		}
	}
	return policy.ActionAttempt
}

// pace waits for the upstream's rate_limit turn: the fleet's when
// shared_state is set (one slot for the fleet, GCRA in Redis), else —
// or when Redis does not answer and on_failure is local — this
// replica's own limiter.
func (v *visit) pace(now time.Time) policy.Action {
	ex := v.ex
	up := v.t.up
	o := up.Options().RateLimit
	limiter, maxWait := up.Pacing()
	switch sl := ex.p.fleet.Load().reserve(v.t.pace, o.RequestsPerSecond, o.Burst, maxWait); {
	case sl.refused:
		v.in.sharedRefused = sl.why
		return policy.ActionStop
	case !sl.local:
		d := v.clear(policy.ObstaclePacing, sl.wait, maxWait, "")
		if d.Action != policy.ActionAttempt {
			return v.carry(d)
		}
		ex.client.enter(phasePacing)
		if !v.wait(d.Wait, sourceFleetLimit) {
			return policy.ActionStop
		}
		return policy.ActionAttempt
	}
	r := limiter.ReserveN(now, 1)
	d := v.clear(policy.ObstaclePacing, r.DelayFrom(now), maxWait, "")
	if d.Action != policy.ActionAttempt {
		r.CancelAt(now)
		return v.carry(d)
	}
	ex.client.enter(phasePacing)
	if !v.wait(d.Wait, sourceRateLimit) {
		r.Cancel()
		return policy.ActionStop
	}
	return policy.ActionAttempt
}

// reserveTokens reserves the request's estimate of its target's
// tokens_per_minute for the model as sent, once a visit. A patient one
// waits for a window that cannot take it, as pacing does (up to
// rate_limit.max_wait; a second when reservations in flight hold it), at
// most three times, else the target is passed over (a fallback) or the
// request refused 429. An impatient one says full instead of waiting.
func (v *visit) reserveTokens(patient bool) (act policy.Action, full bool) {
	ex := v.ex
	mt := v.t.up.Tokens(v.model)
	if mt == nil || v.tokensHeld || !ex.req.call.Charged() {
		return policy.ActionAttempt, false
	}
	q, f, name := &ex.req, ex.p.fleet.Load(), ""
	n := q.estimate(ex.ctx.Request.Body()).of(tokensTotal, mt.Limit)
	if f != nil {
		name = f.upstreamBudgetName(v.t.up, mt.Glob)
	}
	for range 3 {
		ok, wait, _, refused := q.reserveBudget(&ex.p.fleet, f, name, mt.Window, tokensTotal, mt.Limit, n, true, time.Now())
		if refused != "" {
			v.in.sharedRefused = refused
			return policy.ActionStop, false
		}
		if ok {
			v.tokensHeld = true
			return policy.ActionAttempt, false
		}
		if !patient {
			return policy.ActionAttempt, true
		}
		d := v.clear(policy.ObstaclePacing, max(wait, time.Second), v.t.up.TokenWait(), "tokens_per_minute")
		if d.Action != policy.ActionAttempt {
			return v.carry(d), false
		}
		ex.client.enter(phasePacing)
		if !v.wait(d.Wait, sourceRateLimit) {
			return policy.ActionStop, false
		}
	}
	return v.carry(v.clear(policy.ObstaclePacing, time.Second, 0, "tokens_per_minute")), false
}

// attemptOn clears the gates of v's target (gate), chooses an endpoint
// (choose) and sends one attempt there (send), in a: the loop's step,
// which a rescue's continuation takes too. Its action is ActionAttempt
// when the attempt was sent, else what stood in the way (and a is the
// last one made).
func (v *visit) attemptOn(a *attempt) policy.Action {
	if act := v.gate(); act != policy.ActionAttempt {
		return act
	}
	next := attempt{why: a.why, refused: a.refused, rp: a.rp} // until it is sent (roundTrip), the last one's; its reply to take over
	for {
		if act := v.choose(&next); act != policy.ActionAttempt {
			return act
		}
		// Tokens are reserved once the queue is behind: a request waiting
		// for a place holds none of a window others could use.
		act, full := v.reserveTokens(false)
		if !full && act == policy.ActionAttempt {
			break
		}
		next.lease.Release(upstream.Sample{}) // unused: it counts nothing
		next.tk.Report(breaker.Excluded, breaker.Excluded, "")
		if !full {
			return act
		}
		if act, _ = v.reserveTokens(true); act != policy.ActionAttempt { // the window is waited for without a place held
			return act
		}
	}
	*a = next
	v.send(a)
	return policy.ActionAttempt
}

// decide returns policy's decision on what follows attempt at on v's
// target, with the retry budget reserved for a retry it chose.
func (v *visit) decide(at *attempt) policy.Decision {
	ex := v.ex
	up, vd := v.t.up, at.verdict
	now := time.Now()
	failoverBy := "" // what of a pass-through reply the route fails over on
	a := policy.Attempt{Verdict: vd, N: v.n, Total: ex.loop.counted(), AfterStale: at.stale,
		Replayable: ex.req.replayable, Remaining: ex.req.deadline.Sub(now), HasFallback: ex.req.route.fallbackAfter(ex.req.call.API, v.ti),
		Riding:    now.Before(v.rideUntil) && at.ep.Out(),
		Elsewhere: vd.Class == policy.ClassRetryable && up.Elsewhere(v.model, v.tried[:v.nTried])}
	if vd.Class == policy.ClassRetryable {
		a.Refused = at.refused && !a.Elsewhere
		a.RideLeft = v.rideLeft(now)
		a.Out = !up.AnyUsable(v.model)
	}
	if at.replied() {
		a.ServerWait, a.HasServerWait, a.Cooldown = v.learnRateLimits(at, now)
		// A pass-through fails over when the route says so, and on a
		// billing quota spent (another provider may have one left).
		if vd.Class == policy.ClassPassThrough {
			if failoverBy = ex.failoverStatus(at); at.out.InsufficientQuota {
				failoverBy = "insufficient_quota"
			}
			a.FailoverStatus = failoverBy != ""
		}
	}
	reserved := false
	if vd.Class == policy.ClassRetryable {
		reserved = up.Budget().Reserve(now)
		a.BudgetSpent = !reserved
	}
	d := ex.req.retry.Decide(a, ex.p.rand)
	if d.Source != policy.WaitServer {
		v.own = ownCooldown{} // only the retry its wait was honoured for is not held by it
	}
	ex.report().decided(d, failoverBy)
	if reserved && !d.SpendsBudget() {
		up.Budget().Cancel(now)
	}
	if d.SpendsBudget() {
		v.reservedAt = now
	}
	return d
}

// send makes attempt a on v's target, reports it to the breakers, counts
// and notes it; a's outcome and verdict say how it went.
func (v *visit) send(a *attempt) {
	ex := v.ex
	t, lp, ep := v.t, &ex.loop, a.ep
	up := t.up
	a.ti, a.up = v.ti, up
	// The previous reply is given up now (its body and its connection
	// place), and the place taken for this attempt goes with this one's.
	a.rp = a.rp.reuse(&ex.client.inUse)
	a.rp.lease, a.lease = a.lease, upstream.Lease{}
	a.stale = v.replaying
	switch {
	case v.reriding:
		lp.rides++
	case a.stale:
		lp.replays++
	default:
		v.n++
	}
	lp.attempts++
	v.replaying, v.reriding, v.in.blocked = false, false, false
	a.sentAt = time.Now()
	if v.n == 1 && !a.stale && !v.continuing {
		up.Budget().FirstAttempt(a.sentAt)
	}
	a.n, a.model, a.cont = lp.attempts, v.model, ex.st.rescue.tries > 0
	v.aim(ep)
	ex.report().attemptStarted(&ex.req, ex.ctx.Method(), a)
	v.roundTrip(a)
	out := a.out
	a.verdict = policy.Classify(out)
	vd, cause := a.verdict, ""
	if vd.Class == policy.ClassRetryable {
		cause = a.failureCause() // for what a breaker this opens says tripped it
	}
	a.tk.Report(breakerResult(vd.Conn), breakerResult(vd.ReplyHealth(out, ep.Adaptive())), cause)
	if vd.Class == policy.ClassRetryable && out.Fault != policy.FaultStale {
		v.failedOn(ep)
	}
	if vd.Class != policy.ClassRetryable && vd.Class != policy.ClassClientGone && up.Cooldowns().InStreak() {
		up.Cooldowns().Succeeded(v.cooldownKey()) // a run of bare 429s ends
	}
	lp.lastStatus = out.Status // 0 for a fault
	if vd.Class != policy.ClassClientGone && out.Fault != policy.FaultStale && vd.Reason != policy.Reason429 {
		ep.Outcome(vd.Class == policy.ClassRetryable) // a 429 is the quota's, not the replica's
	}
	ex.report().attemptEnded(a)
}

// retrying notes a retry policy chose after attempt a on v's target,
// once its wait is over: the next attempt is a stale replay, or follows
// a ride-through probe, when d says so.
func (v *visit) retrying(a *attempt, d policy.Decision) {
	v.replaying, v.reriding = d.Replay, d.Ride
	v.ex.report().retried(v.t.up, a.verdict.Reason, a.ep, d)
}

// ownRetry reports whether this attempt is the retry of the request whose
// 429 started the cooldown of v's upstream with the wait it asked for, that wait now
// waited: the cooldown (its end moved later by the jitter, for everyone
// else) does not hold it — unless something has set a later end since.
func (v *visit) ownRetry() bool {
	up, own := v.t.up, v.own
	v.own = ownCooldown{}
	return own.up == up && up.Cooldowns().End(v.cooldownKey()).Equal(own.until)
}

// counted is the attempts max_total_attempts counts: stale replays and
// ride-through probes are not.
func (lp *loopState) counted() int { return lp.attempts - lp.rides - lp.replays }

// setCredential sets the outbound request's credential for up: its
// api_key when it has one — as x-api-key on the Messages API's paths
// unless api_key_header says authorization, else as Bearer — and none of
// the client's; with auth on none at all (the client's credential is
// Sturdy's own key); else the client's Authorization and x-api-key as
// sent.
func (ex *exchange) setCredential(up *upstream.Upstream) {
	h, client := &ex.req.msg.Header, &ex.ctx.Request.Header
	h.DelBytes(hdrAuthorization)
	h.DelBytes(hdrXAPIKey)
	switch {
	case up.Auth() != nil && ex.req.call.API == policy.APIAnthropic:
		h.SetBytesKV(up.MessagesAuth())
	case up.Auth() != nil:
		h.SetBytesKV(hdrAuthorization, up.Auth())
	case len(ex.tbl.authKeys) > 0:
	default:
		for _, name := range [2][]byte{hdrAuthorization, hdrXAPIKey} {
			if v := client.PeekCanonical(name); len(v) > 0 {
				h.SetBytesKV(name, v)
			}
		}
	}
}

// cooldownKey keys the cooldowns of v's upstream for this request,
// computed once per visit: the credential — the upstream's own key when
// Sturdy injects one (all clients share it), else the client's (Bearer,
// else x-api-key: credential) — and the model as sent, since providers
// rate-limit per key and per model.
func (v *visit) cooldownKey() uint64 {
	ex := v.ex
	if !v.coolKnown {
		var cred []byte
		if v.t.up.Auth() == nil {
			cred, _ = credential(&ex.ctx.Request.Header)
		}
		// The same in every replica, so the fleet shares it.
		v.coolDigest = fleet.Digest(ex.p.fleet.Load().hashKey(), cred, unsafe.Slice(unsafe.StringData(v.model), len(v.model)))
		v.coolKey, v.coolKnown = localKey(v.coolDigest), true
	}
	return v.coolKey
}

// cooldownLeft returns how long the cooldown of v's upstream for this
// request's key lasts from now (0: none); with no cooldown in force it is
// one atomic load.
func (v *visit) cooldownLeft(now time.Time) time.Duration {
	cd := v.t.up.Cooldowns()
	if !cd.Possible(now) {
		return 0
	}
	return cd.Remaining(v.cooldownKey(), now)
}

// extend adds a random 0–10 % to a cooldown, so clients that learned the
// same Retry-After do not all come back in the same millisecond (never
// earlier than the server asked).
func (ex *exchange) extend(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d + time.Duration(ex.p.rand(int64(d/10)+1))
}

// learnRateLimits reads the rate-limit headers of at's reply: a 429's
// Retry-After (returned as the server's wait), OpenAI's
// x-ratelimit-remaining-requests (or -tokens): 0 and Anthropic's
// anthropic-ratelimit-*-remaining: 0 (on any reply) put the upstream in
// cooldown for this credential until then — at most cooldown.max. A 429
// that gives no wait starts a bare cooldown, returned as cooldown: the
// next attempt here would meet it. A 429's own wait is this request's to
// wait (lp.own): its retry is not held by the cooldown the wait started.
func (v *visit) learnRateLimits(at *attempt, now time.Time) (wait time.Duration, ok bool, cooldown time.Duration) {
	ex := v.ex
	up, h, vd := v.t.up, &at.rp.msg.Header, at.verdict
	is429 := vd.Reason == policy.Reason429
	if vd.Class == policy.ClassRetryable {
		wait, ok = policy.RetryAfter(h.PeekCanonical(hdrRetryAfterMS), h.PeekCanonical(hdrRetryAfter), now)
	}
	if up.BareCooldown() <= 0 { // cooldown.enabled: false
		return wait, ok, 0
	}
	until, fromWait := time.Time{}, false
	if ok && is429 {
		until, fromWait = now.Add(ex.extend(wait)), true
	}
	exhausted := func(d time.Duration, ok bool) {
		if !ok {
			return
		}
		if t := now.Add(ex.extend(d)); t.After(until) {
			until, fromWait = t, false
		}
	}
	for _, q := range [][2][]byte{{hdrRateLimitRemaining, hdrRateLimitReset}, {hdrRateLimitRemainingTokens, hdrRateLimitResetTokens}} {
		exhausted(policy.RateLimitExhausted(h.PeekCanonical(q[0]), h.PeekCanonical(q[1])))
	}
	if ex.req.call.API == policy.APIAnthropic { // only its replies carry them: no header scans on every other
		date := h.PeekCanonical(hdrDate)
		for _, q := range anthropicLimits {
			if rem := h.PeekCanonical(q[0]); len(rem) > 0 { // its reset is read only when it is there
				exhausted(policy.AnthropicLimitExhausted(rem, h.PeekCanonical(q[1]), date, now))
			}
		}
	}
	switch {
	case until.After(now):
		until = up.Cooldowns().Set(v.cooldownKey(), now, until) // cooldown.max caps it
		ex.p.fleet.Load().publishCooldown(up, v.coolDigest, until, 0)
		if fromWait {
			v.own = ownCooldown{up: up, until: until}
		}
	case is429 && !ok: // "too many", but not for how long
		d, streak := up.Cooldowns().Bare(v.cooldownKey(), now, up.BareCooldown(), ex.extend)
		ex.p.fleet.Load().publishCooldown(up, v.coolDigest, now.Add(d), streak)
		cooldown = d
	default:
		return wait, ok, 0
	}
	ex.report().cooledDown(up)
	return wait, ok, cooldown
}

// failoverStatus says why a pass-through reply is one the route fails
// over on — "failover_on" (its status is in failover_on), "failover_code"
// (a 400 whose error code, or a stream's in-band error code, is in
// failover_codes) — or "" when it is not.
func (ex *exchange) failoverStatus(at *attempt) string {
	out, status, r := &at.out, at.rp.msg.StatusCode(), ex.req.route
	if slices.Contains(r.failoverOn, status) {
		return "failover_on"
	}
	if out.StreamFailed { // the client's own error, told in a stream's first event
		if slices.Contains(r.failoverCodes, out.StreamError) {
			return "failover_code"
		}
		return ""
	}
	if status != 400 || len(r.failoverCodes) == 0 {
		return ""
	}
	// OpenAI's error.code, or Anthropic's error.type (it has no code).
	e := gjson.GetBytes(at.rp.head, "error")
	for _, code := range [2]string{e.Get("code").String(), e.Get("type").String()} {
		if code != "" && slices.Contains(r.failoverCodes, code) {
			return "failover_code"
		}
	}
	return ""
}

func breakerResult(h policy.Health) breaker.Result {
	switch h {
	case policy.HealthSuccess:
		return breaker.Success
	case policy.HealthFailure:
		return breaker.Failure
	case policy.HealthUnreachable:
		return breaker.Unreachable // nothing answered: probed again soon (breaker.FirstOpen)
	default:
		return breaker.Excluded
	}
}
