package proxy

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"sturdy/breaker"
	"sturdy/policy"
)

// obstacleKind says why a target could not be used at all.
type obstacleKind uint8

const (
	obstacleNone        obstacleKind = iota
	obstacleBreaker                  // its breaker is open
	obstacleCooldown                 // cooling down after a 429 for this credential
	obstacleRateLimited              // pacing would wait past max_wait
	obstacleBusy                     // no max_in_flight slot within queue_timeout
)

func (k obstacleKind) String() string {
	switch k {
	case obstacleBreaker:
		return "breaker_open"
	case obstacleCooldown:
		return "cooldown"
	case obstacleRateLimited:
		return "rate_limited"
	case obstacleBusy:
		return "busy"
	default:
		return ""
	}
}

// obstacle is the soonest-clearing reason no target could take the request.
type obstacle struct {
	kind     obstacleKind
	upstream string
	wait     time.Duration // until it clears, as far as known
}

// targetNote is one target as logged: which, with what model, how many
// attempts, and how its last attempt (or obstacle) ended.
type targetNote struct {
	upstream string
	model    string
	attempts int
	result   string
}

// run is the attempt loop. It walks the route's targets in order; on each
// it owns "try again?" and the wait, and it ends with the client's
// response committed (or written). One deadline and max_total_attempts
// span all targets.
func (ex *exchange) run() {
	for ; ex.ti < len(ex.route.targets); ex.ti++ {
		t := &ex.route.targets[ex.ti]
		if !ex.useTarget(t) {
			continue
		}
		if ex.tryTarget(t) {
			return
		}
		if ex.ti+1 < len(ex.route.targets) {
			ex.p.m.Failovers.WithLabelValues(ex.route.name, t.up.name).Inc()
		}
	}
	ex.noTargetLeft()
}

// useTarget makes t the current target: it takes a max_in_flight slot
// (waiting up to queue_timeout) and rebuilds the request's target-specific
// parts. false means t cannot be used now; ex.obstacle says why.
func (ex *exchange) useTarget(t *target) bool {
	ex.leaveTarget()
	ex.up, ex.n = t.up, 0
	ex.note(t.up.name, t.model)
	if t.up.slots != nil {
		if !t.up.slots.acquire(min(t.up.queueTimeout, time.Until(ex.deadline))) {
			ex.block(obstacleBusy, t.up, time.Second)
			return false
		}
		ex.slot = t.up
	}
	t.up.inFlight.Add(1)
	ex.entered = t.up

	req := ex.req
	ex.uri = append(append(ex.uri[:0], t.up.base...), ex.ctx.Request.Header.RequestURI()...)
	req.SetRequestURIBytes(ex.uri)
	req.Header.DelBytes(hdrAuthorization)
	if t.up.auth != nil {
		req.Header.SetBytesKV(hdrAuthorization, t.up.auth)
	} else if a := ex.ctx.Request.Header.PeekBytes(hdrAuthorization); len(a) > 0 && len(ex.tbl.authKeys) == 0 {
		// With auth on, the client's Authorization is Sturdy's own key:
		// it never goes upstream.
		req.Header.SetBytesKV(hdrAuthorization, a)
	}
	body := ex.ctx.Request.Body()
	if t.model != "" && gjson.GetBytes(body, "model").String() != t.model {
		// Only the "model" value changes; every other byte stays.
		if rewritten, err := sjson.SetBytes(append(ex.body0[:0], body...), "model", t.model); err == nil {
			ex.body0, body = rewritten, rewritten
		}
	}
	req.SetBodyRaw(body)
	return true
}

// leaveTarget gives back what the current target holds.
func (ex *exchange) leaveTarget() {
	if ex.slot != nil {
		ex.slot.slots.release()
		ex.slot = nil
	}
	if ex.entered != nil {
		ex.entered.inFlight.Add(-1)
		ex.entered = nil
	}
}

// tryTarget runs attempts on the current target until one is committed
// (true) or the loop should fail over (false).
func (ex *exchange) tryTarget(t *target) bool {
	up := t.up
	for {
		now, ok := ex.gate(up)
		if !ok {
			return false
		}
		ticket, ok := up.breaker.Allow()
		if !ok {
			if ex.n > 0 { // it opened between our retries
				ex.stop = policy.StopBreakerOpen
			}
			ex.block(obstacleBreaker, up, max(up.breaker.ProbeIn(time.Now()), time.Second))
			return false
		}
		ex.closeBody()
		ex.attempts++
		ex.n++
		if ex.n == 1 {
			up.budget.FirstAttempt(now)
		}
		out := ex.attempt(t, now)
		now = time.Now()
		ex.verdict = policy.Classify(out)
		ticket.Done(breakerResult(ex.verdict.Health))
		ex.fault, ex.hasReply = out.Fault, out.Fault == policy.FaultNone
		if ex.hasReply {
			ex.replyUp = up
		}
		result := resultLabel(ex.verdict)
		up.countAttempt(ex.p, result)
		ex.noteResult(result, true)

		a := policy.Attempt{Verdict: ex.verdict, N: ex.n, Total: ex.attempts, Replayable: ex.replayable,
			Remaining: ex.deadline.Sub(now), HasFallback: ex.ti+1 < len(ex.route.targets)}
		if ex.hasReply {
			a.ServerWait, a.HasServerWait = ex.learnRateLimits(up, now)
			a.FailoverStatus = ex.verdict.Class == policy.ClassPassThrough && ex.failoverStatus()
		}
		retry := ex.route.retry
		retry.MaxAttempts = ex.perTarget
		step := retry.Next(a, ex.p.rand)
		if step.Retry && !up.budget.TryRetry(now) {
			ex.p.m.BudgetExhausted.WithLabelValues(up.name).Inc()
			a.BudgetSpent = true
			step = retry.Next(a, ex.p.rand)
		}
		switch {
		case step.Failover:
			return false
		case !step.Retry:
			ex.stop = step.Stop
			ex.conclude()
			return true
		}
		ex.p.m.Retries.WithLabelValues(up.name, ex.verdict.Reason.String()).Inc()
		source := "backoff"
		if step.FromServer {
			source = "server"
		}
		ex.p.m.RetryWait.WithLabelValues(up.name, source).Observe(step.Wait.Seconds())
		if ex.nRetries < maxLoggedRetries {
			ex.retries[ex.nRetries] = retryNote{reason: ex.verdict.Reason, wait: step.Wait}
			ex.nRetries++
		}
		sleep(step.Wait)
	}
}

// gate clears the way for one attempt on up: a cooldown learned from a
// 429 for this request's credential, and pacing. It may wait, but never
// past the deadline, and it does not wait for a cooldown when a fallback
// can take the request at once. It returns the time the attempt may
// start; false: ex.obstacle says why.
func (ex *exchange) gate(up *upstream) (time.Time, bool) {
	now := time.Now()
	if left := up.cooldownLeft(ex, now); left > 0 {
		hasFallback := ex.ti+1 < len(ex.route.targets)
		if hasFallback || left > ex.route.retry.MaxRetryAfter || left >= ex.deadline.Sub(now) {
			ex.block(obstacleCooldown, up, left)
			return now, false
		}
		sleep(left)
		now = time.Now()
	}
	if up.limiter != nil {
		r := up.limiter.ReserveN(now, 1)
		d := r.DelayFrom(now)
		if d > up.maxWait || d >= ex.deadline.Sub(now) {
			r.CancelAt(now)
			ex.block(obstacleRateLimited, up, d)
			return now, false
		}
		if d > 0 {
			sleep(d)
			now = time.Now()
		}
	}
	return now, true
}

// credFor keys up's cooldowns: the upstream's own key when Sturdy injects
// one (all clients share it), else the client's Authorization.
func (ex *exchange) credFor(up *upstream) uint64 {
	if up.auth != nil {
		return 0
	}
	if !ex.credKnown {
		ex.cred, ex.credKnown = credHash(ex.ctx.Request.Header.PeekBytes(hdrAuthorization)), true
	}
	return ex.cred
}

// learnRateLimits reads the reply's rate-limit headers: a 429's
// Retry-After (returned as the server's wait) and OpenAI's
// x-ratelimit-remaining-requests: 0 (on any reply) put the upstream in
// cooldown for this credential until then.
func (ex *exchange) learnRateLimits(up *upstream, now time.Time) (wait time.Duration, ok bool) {
	h := &ex.resp.Header
	if ex.verdict.Class == policy.ClassRetryable {
		wait, ok = policy.RetryAfter(h.PeekBytes(hdrRetryAfterMS), h.PeekBytes(hdrRetryAfter), now)
	}
	until := time.Time{}
	if ok && ex.verdict.Reason == policy.Reason429 {
		until = now.Add(wait)
	}
	if d, exhausted := policy.RateLimitExhausted(h.PeekBytes(hdrRateLimitRemaining), h.PeekBytes(hdrRateLimitReset)); exhausted {
		if t := now.Add(d); t.After(until) {
			until = t
		}
	}
	if !until.IsZero() && until.After(now) {
		up.cooldowns.set(ex.credFor(up), until)
		ex.p.m.Cooldowns.WithLabelValues(up.name).Inc()
	}
	return wait, ok
}

// failoverStatus reports whether a pass-through reply is one the route
// fails over on: a status in failover_on, or a 400 whose error code is in
// failover_codes.
func (ex *exchange) failoverStatus() bool {
	status := ex.resp.StatusCode()
	if slices.Contains(ex.route.failoverOn, status) {
		return true
	}
	if status != 400 || len(ex.route.failoverCodes) == 0 {
		return false
	}
	code := gjson.GetBytes(ex.head, "error.code").String()
	return code != "" && slices.Contains(ex.route.failoverCodes, code)
}

// block records why a target could not be used, keeping the obstacle
// that clears soonest.
func (ex *exchange) block(kind obstacleKind, up *upstream, wait time.Duration) {
	ex.p.m.TargetSkips.WithLabelValues(up.name, kind.String()).Inc()
	ex.noteResult(kind.String(), false)
	if ex.obstacle.kind == obstacleNone || wait < ex.obstacle.wait {
		ex.obstacle = obstacle{kind: kind, upstream: up.name, wait: wait}
	}
}

func (ex *exchange) note(upstream, model string) {
	if ex.nTried < maxLoggedTargets {
		ex.tried[ex.nTried] = targetNote{upstream: upstream, model: model}
		ex.nTried++
	}
}

// noteResult records how the current target's last attempt ended, or,
// with attempted false, why it was skipped.
func (ex *exchange) noteResult(result string, attempted bool) {
	if ex.nTried > 0 {
		n := &ex.tried[ex.nTried-1]
		if attempted {
			n.attempts++
		}
		n.result = result
	}
}

// sleep waits d on a timer that is always stopped.
func sleep(d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	<-t.C
	t.Stop()
}

// resultLabel names an attempt's result for metrics and logs.
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
// timeout is the upstream's first_byte, or for a stream the route's
// first_token when shorter, cut short by the deadline.
func (ex *exchange) attempt(t *target, now time.Time) policy.Outcome {
	timeout := min(t.up.firstByte, ex.deadline.Sub(now))
	if ex.firstToken > 0 {
		timeout = min(timeout, ex.firstToken)
	}
	if timeout <= 0 {
		return policy.Outcome{Fault: policy.FaultTimeout}
	}
	err := t.up.client.DoTimeout(ex.req, ex.resp, timeout)
	if err != nil && ex.replayable && !isTimeout(err) && staleConnection(ex.resp) {
		if timeout = min(timeout, time.Until(ex.deadline)); timeout > 0 {
			err = t.up.client.DoTimeout(ex.req, ex.resp, timeout)
		}
	}
	if err != nil {
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
// 429/5xx, whose bodies are inspected or kept as the last reply, and for
// a 400 the route may fail over on), and one chunk of anything longer.
func (ex *exchange) readHead(status int) policy.Fault {
	ex.head, ex.headOff = ex.head[:0], 0
	ex.body = ex.resp.BodyStream()
	if ex.body == nil {
		return policy.FaultNone
	}
	cl := ex.resp.Header.ContentLength()
	whole := (cl >= 0 && cl <= headSize) || status == 429 || status >= 500 ||
		(status == 400 && len(ex.route.failoverCodes) > 0)
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
		ex.outcome = outcomeOK
		ex.commit(false)
	case ex.verdict.Class == policy.ClassPassThrough:
		ex.outcome = outcomePassThrough
		ex.commit(false)
	case ex.hasReply:
		ex.giveUp()
	default:
		ex.noReply()
	}
}

// noTargetLeft answers when every target was tried or unusable: with the
// last upstream reply if there is one, else with what stood in the way.
func (ex *exchange) noTargetLeft() {
	if ex.attempts > 0 && ex.stop == policy.StopNone {
		ex.stop = policy.StopUnavailable
	}
	switch {
	case ex.hasReply && ex.verdict.Class != policy.ClassRetryable:
		ex.conclude() // a failover_on reply with nowhere left to go
	case ex.hasReply:
		ex.giveUp()
	case ex.obstacle.kind != obstacleNone && (ex.attempts == 0 || time.Until(ex.deadline) > 0):
		ex.obstructed()
	default:
		ex.noReply()
	}
}

// giveUp returns the last upstream reply as final: Sturdy will not retry
// it and tells the client's SDK not to either.
func (ex *exchange) giveUp() {
	ex.outcome = outcomeExhausted
	ex.commit(true)
}

// obstructed answers when no target could take the request at all.
func (ex *exchange) obstructed() {
	o := ex.obstacle
	switch o.kind {
	case obstacleBreaker:
		ex.outcome = outcomeCircuitOpen
		ex.fail(503, CodeCircuitOpen, fmt.Sprintf("upstream %q is failing and its circuit breaker is open%s; Sturdy is not sending it traffic. Retry after the Retry-After delay",
			o.upstream, ex.alsoTried()), o.wait)
	case obstacleBusy:
		ex.outcome = outcomeUpstreamBusy
		ex.fail(503, CodeUpstreamBusy, fmt.Sprintf("upstream %q is running as many requests as it is allowed (max_in_flight)%s; retry after the Retry-After delay",
			o.upstream, ex.alsoTried()), o.wait)
	default:
		ex.outcome = outcomeRateLimited
		ex.p.m.RateLimited.WithLabelValues(o.kind.String()).Inc()
		ex.fail(429, CodeRateLimited, fmt.Sprintf("upstream %q is rate-limited for this client (%s)%s; retry after the Retry-After delay",
			o.upstream, o.kind, ex.alsoTried()), o.wait)
	}
}

// noReply answers when attempts were made but none produced a response.
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
	if ex.stop == policy.StopDeadline || time.Until(ex.deadline) <= 0 {
		status, code = 504, CodeDeadlineExceeded
		what = "the request's deadline passed before any upstream answered; last: upstream %q"
	}
	msg := fmt.Sprintf(what+" (%s); retry later or check the upstream", ex.up.name, ex.triedText())
	ex.outcome = outcomeUpstreamError
	ex.fail(status, code, msg, 0)
}

// triedText names what was tried: "ollama: 2 attempts, last timeout; …".
func (ex *exchange) triedText() string {
	var parts []string
	for _, n := range ex.tried[:ex.nTried] {
		name := n.upstream
		if n.model != "" {
			name += " as " + n.model
		}
		parts = append(parts, fmt.Sprintf("%s: %d attempt%s, last %s", name, n.attempts, plural(n.attempts), n.result))
	}
	s := strings.Join(parts, "; ")
	if ex.stop != policy.StopNone && ex.stop != policy.StopFinal {
		s += "; " + stopText(ex.stop)
	}
	return s
}

// alsoTried lists the targets tried before the obstacle, if any.
func (ex *exchange) alsoTried() string {
	if ex.nTried <= 1 {
		return ""
	}
	return " (tried " + ex.triedText() + ")"
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
		return "deadline reached"
	case policy.StopNotReplayable:
		return "request not safe to replay"
	case policy.StopNotOn:
		return "not in retry.on"
	case policy.StopBreakerOpen:
		return "circuit breaker opened"
	case policy.StopBudget:
		return "retry budget spent"
	case policy.StopUnavailable:
		return "no target left"
	default:
		return "not retried"
	}
}
