package policy

import "time"

// Action is what the attempt loop does next.
type Action uint8

// The actions of a Decision.
const (
	// ActionAttempt: make an attempt on the current target, after Wait.
	// After an outcome it is a retry in place; at a gate it lets the
	// attempt go ahead.
	ActionAttempt Action = iota
	// ActionFailover: leave the current target for the route's next one,
	// at once.
	ActionFailover
	// ActionStop: try nothing more and answer the client.
	ActionStop
)

// String names the action for tests and debugging.
func (a Action) String() string {
	switch a {
	case ActionAttempt:
		return "attempt"
	case ActionFailover:
		return "failover"
	default:
		return "stop"
	}
}

// WaitSource says who set a wait.
type WaitSource uint8

// The sources of a wait.
const (
	WaitNone     WaitSource = iota
	WaitBackoff             // Sturdy's own full-jitter backoff
	WaitServer              // the upstream's Retry-After / retry-after-ms
	WaitCooldown            // a cooldown learned from an earlier reply
	WaitPacing              // the upstream's rate_limit
)

// String names the source as in the retry-wait metric ("" for WaitNone).
func (s WaitSource) String() string {
	switch s {
	case WaitBackoff:
		return "backoff"
	case WaitServer:
		return "server"
	case WaitCooldown:
		return "cooldown"
	case WaitPacing:
		return "pacing"
	default:
		return ""
	}
}

// Decision is everything the attempt loop needs to carry out what follows
// an attempt (Retry.Decide) or stands before one (Clear).
type Decision struct {
	// Action is what to do.
	Action Action
	// Wait is how long to wait first (ActionAttempt only), and Source who
	// asked for it.
	Wait   time.Duration
	Source WaitSource
	// Stop says why the loop stops (ActionStop), or why it left the
	// target (ActionFailover; StopNone when a rule sent it on, such as
	// failover_on or on_timeout). Only ActionStop's is the request's.
	Stop Stop
	// Replay marks the immediate resend after a stale connection: it is
	// counted as an attempt, but not against max_attempts of the target,
	// the retry budget or the breaker.
	Replay bool
	// Ride sends the request (back) to riding through an outage: its
	// attempt could not connect — a returning endpoint's probe, or every
	// endpoint refusing the connection — so it counts against neither
	// max_attempts, max_total_attempts nor the retry budget; ride_through
	// bounds it. Wait is the pause before the next probe (0: the loop
	// waits for an endpoint to come back).
	Ride bool
}

// SpendsBudget reports whether carrying d out sends a retry the retry
// budget pays for: a retry in place that is not a stale replay.
func (d Decision) SpendsBudget() bool { return d.Action == ActionAttempt && !d.Replay && !d.Ride }

// Attempt is what the loop knows after one attempt, as input to Decide.
type Attempt struct {
	// Verdict is the attempt's classification.
	Verdict Verdict
	// N is the number of attempts made on the current target, this one
	// included (≥ 1); a stale replay shares the number of the attempt it
	// replays.
	N int
	// Total is the number of attempts made across all targets that
	// max_total_attempts counts: stale replays and ride-through probes
	// are not (≥ N).
	Total int
	// AfterStale is true when this attempt was itself a stale replay.
	AfterStale bool
	// HasFallback is true when another target remains to fail over to.
	HasFallback bool
	// FailoverStatus is true when a pass-through reply matched the route's
	// failover_on statuses or failover_codes.
	FailoverStatus bool
	// BudgetSpent is true when the upstream's retry budget has no retry
	// left now (Budget.Reserve refused one).
	BudgetSpent bool
	// Replayable is Replayable() of the request.
	Replayable bool
	// ServerWait is the wait the upstream asked for (Retry-After or
	// retry-after-ms); HasServerWait says whether it asked at all.
	ServerWait    time.Duration
	HasServerWait bool
	// Remaining is the time left until the request's deadline.
	Remaining time.Duration
	// Riding is true when the request rides through an outage (time of
	// its ride_through left) and this attempt's failure put its endpoint
	// back out.
	Riding bool
	// Elsewhere is true when another endpoint of the target, one this
	// request has not failed on, can take the retry: it goes at once,
	// without a backoff (the failure was most likely that replica's).
	Elsewhere bool
	// Refused is true when the connection was refused and no other
	// endpoint of the target is left to try (not Elsewhere): nothing
	// listens there — a server killed or not up yet.
	Refused bool
	// RideLeft is how long the request may still ride through an outage
	// of the target (ride_through, within the deadline; 0: it may not).
	RideLeft time.Duration
	// Out is true when, after the attempt, no endpoint of the target can
	// take the next one: its breakers (this one's opened again, a failed
	// half-open probe) or health checks have them all out.
	Out bool
	// Cooldown is how long the cooldown this attempt's reply started (a
	// 429 without a wait) keeps the target from the next attempt; a
	// server's own wait is not one (the request that learned it retries
	// when it ends).
	Cooldown time.Duration
}

// Decide says what follows attempt a: a retry on the same target after a
// wait, a failover to the next target, or a stop, with the reason. The
// loop asks it once per attempt (proxy's decide); what follows a stream
// cut after its commit is Rescue's and RescueNext's instead. r should
// have its defaults filled (WithDefaults).
//
// A server-given wait is used exactly; otherwise the full-jitter backoff
// draws one with rnd. A wait that would reach the deadline is never
// started. Where retrying in place must stop, the next target is tried
// instead if one is left, the request is safe to send elsewhere and
// max_total_attempts allows. No backoff is slept before a failover that
// is already decided: a target that refused every connection, whose
// endpoints are all out after the attempt, or that the attempt's own
// bare 429 put in cooldown is left at once when a fallback can take the
// request. A stale connection is resent at once, once per attempt, for a
// replayable request; otherwise it counts as a reset. A request whose
// target refused every connection with no fallback left rides through
// (ride_through), as one that found its breaker open: its probes are
// uncounted. A retry that goes to another replica goes at once.
//
// shape:long the decision table, read top to bottom as the rules above.
func (r Retry) Decide(a Attempt, rnd func(int64) int64) Decision {
	v := a.Verdict
	maxTotal := r.TotalAttempts()
	if v.Reason == ReasonStale {
		if d, ok := DecideStale(a); ok {
			return d
		}
		v.Reason = ReasonReset
	}
	safe := a.Replayable || v.Reason == ReasonConnect || r.ReplayWrites
	canFailover := a.HasFallback && a.Total < maxTotal && a.Remaining > 0
	// leave moves to the next target when it can, else stops.
	leave := func(stop Stop) Decision {
		if canFailover && safe {
			return Decision{Action: ActionFailover, Stop: stop}
		}
		return Decision{Action: ActionStop, Stop: stop}
	}
	stop := func(s Stop) Decision { return Decision{Action: ActionStop, Stop: s} }
	ride := func(wait time.Duration) Decision {
		d := Decision{Action: ActionAttempt, Ride: true, Wait: wait}
		if wait > 0 {
			d.Source = WaitBackoff
		}
		return d
	}
	switch {
	case v.Class == ClassClientGone:
		return stop(StopClientGone)
	case v.Class == ClassPassThrough && a.FailoverStatus && canFailover && a.Replayable:
		return Decision{Action: ActionFailover}
	case v.Class != ClassRetryable:
		return stop(StopFinal)
	case v.Reason == ReasonConnect && a.Remaining > 0 && a.Riding:
		return ride(0) // a probe that could not connect: the loop waits for the next
	case !r.On.Has(v.Reason):
		return stop(StopNotOn)
	case !safe:
		return stop(StopNotReplayable)
	case a.Remaining <= 0:
		return stop(StopDeadline)
	case v.Reason == ReasonConnect && a.Refused && canFailover:
		return Decision{Action: ActionFailover} // nothing listens: no backoff, no other attempt here
	case v.Reason == ReasonConnect && a.Refused && a.RideLeft > 0:
		return ride(min(r.Backoff.Delay(a.N, rnd), a.RideLeft))
	case a.Total >= maxTotal:
		return stop(r.maxStop())
	case a.Out && canFailover:
		return Decision{Action: ActionFailover, Stop: StopBreakerOpen}
	case a.Out && a.RideLeft <= 0:
		return stop(StopBreakerOpen)
	case v.Reason == ReasonTimeout && r.OnTimeout == OnTimeoutFailover && canFailover:
		return Decision{Action: ActionFailover}
	case a.HasServerWait && a.ServerWait > r.MaxRetryAfter:
		return leave(StopRetryAfterTooLong)
	case a.HasServerWait && a.ServerWait >= a.Remaining:
		return leave(StopDeadline)
	case a.N >= r.MaxAttempts:
		return leave(StopMaxAttempts)
	case a.BudgetSpent:
		return leave(StopBudget)
	case a.HasServerWait:
		return Decision{Action: ActionAttempt, Wait: a.ServerWait, Source: WaitServer}
	case a.Cooldown > 0 && canFailover:
		return Decision{Action: ActionFailover} // the retry would meet the cooldown: leave now
	case a.Elsewhere:
		return Decision{Action: ActionAttempt, Source: WaitBackoff} // another replica: no wait
	}
	wait := max(r.Backoff.Delay(a.N, rnd), a.Cooldown)
	if wait >= a.Remaining {
		return leave(StopDeadline)
	}
	return Decision{Action: ActionAttempt, Wait: wait, Source: WaitBackoff}
}

// TotalAttempts is the attempts a request may make across all its
// targets: MaxTotalAttempts, or MaxAttempts when it is not set (a Retry
// without its defaults filled).
func (r Retry) TotalAttempts() int {
	if r.MaxTotalAttempts > 0 {
		return r.MaxTotalAttempts
	}
	return r.MaxAttempts
}

// maxStop is the stop of a request that used up max_total_attempts:
// StopMaxTotalAttempts when that is more than one target's max_attempts.
func (r Retry) maxStop() Stop {
	if r.TotalAttempts() > r.MaxAttempts {
		return StopMaxTotalAttempts
	}
	return StopMaxAttempts
}

// DecideStale resends a replayable request at once after a stale
// connection, once per attempt, within the deadline — uncounted by
// max_total_attempts, so it never takes the attempt another target needs;
// ok is false when the stale connection is to be taken as a reset. Decide
// applies it first; a rescue's continuation, which is not retried
// otherwise, applies it alone.
func DecideStale(a Attempt) (d Decision, ok bool) {
	switch {
	case !a.Replayable || a.AfterStale:
		return d, false
	case a.Remaining <= 0:
		return Decision{Action: ActionStop, Stop: StopDeadline}, true
	}
	return Decision{Action: ActionAttempt, Replay: true}, true
}

// Obstacle is what may stand before an attempt on a target.
type Obstacle uint8

// The obstacles.
const (
	ObstacleNone Obstacle = iota
	// ObstacleBreaker: the breaker is open (or half-open, probes taken).
	ObstacleBreaker
	// ObstacleCooldown: cooling down after a 429 for this credential.
	ObstacleCooldown
	// ObstaclePacing: the rate limiter's next turn is later than now.
	ObstaclePacing
	// ObstacleBusy: no max_in_flight slot freed within queue_timeout.
	ObstacleBusy
	// ObstacleUnhealthy: every endpoint is out by its health checks (or
	// DNS dropped it), none by a breaker.
	ObstacleUnhealthy
)

// String names the obstacle as in logs and the target-skips metric.
func (o Obstacle) String() string {
	switch o {
	case ObstacleBreaker:
		return "breaker_open"
	case ObstacleCooldown:
		return "cooldown"
	case ObstaclePacing:
		return "rate_limited"
	case ObstacleBusy:
		return "busy"
	case ObstacleUnhealthy:
		return "unhealthy"
	default:
		return ""
	}
}

// Gate is what the loop knows of one obstacle, as input to Clear.
type Gate struct {
	// Obstacle is what stands in the way.
	Obstacle Obstacle
	// Wait is how long until it clears, as far as known.
	Wait time.Duration
	// MaxWait is the longest it may be waited for: max_retry_after for a
	// cooldown, rate_limit.max_wait for pacing. A breaker or a busy
	// target (whose wait for a slot is already over) is never waited for.
	MaxWait time.Duration
	// Remaining is the time left until the request's deadline.
	Remaining time.Duration
	// HasFallback is true when another target remains.
	HasFallback bool
	// N counts the attempts made on this target; Total across all.
	N, Total int
}

// Clear decides what an obstacle before an attempt means: wait for it
// (ActionAttempt with the wait), fail over to the next target, or refuse
// (ActionStop) when none is left. A cooldown is waited for only when no
// fallback can take the request at once; pacing is waited for up to its
// max_wait. No wait is started that would reach the deadline.
func Clear(g Gate) Decision {
	fits := g.Wait <= g.MaxWait && g.Wait < g.Remaining
	switch {
	case g.Obstacle == ObstacleNone:
		return Decision{Action: ActionAttempt}
	case g.Obstacle == ObstacleCooldown && fits && !g.HasFallback:
		return Decision{Action: ActionAttempt, Wait: g.Wait, Source: WaitCooldown}
	case g.Obstacle == ObstaclePacing && fits:
		return Decision{Action: ActionAttempt, Wait: g.Wait, Source: WaitPacing}
	case g.HasFallback:
		return Decision{Action: ActionFailover}
	case g.Obstacle == ObstacleBreaker && g.N > 0:
		return Decision{Action: ActionStop, Stop: StopBreakerOpen}
	case g.Total > 0:
		return Decision{Action: ActionStop, Stop: StopUnavailable}
	}
	return Decision{Action: ActionStop}
}
