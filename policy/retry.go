package policy

import (
	"fmt"
	"strings"
	"time"
)

// RetryOn is the set of reasons a route retries on (`retry.on`). The zero
// value retries on nothing.
type RetryOn uint8

// RetryOnAll is every reason: 429, 5xx, connect, reset and timeout.
const RetryOnAll = RetryOn(1<<Reason429 | 1<<Reason5xx | 1<<ReasonConnect | 1<<ReasonReset | 1<<ReasonTimeout)

// Has reports whether r includes reason.
func (r RetryOn) Has(reason Reason) bool { return reason != ReasonNone && r&(1<<reason) != 0 }

// ParseRetryOn turns the names of `retry.on` ("429", "5xx", "connect",
// "reset", "timeout") into a RetryOn. An unknown name is an error that
// lists the known ones.
func ParseRetryOn(names []string) (RetryOn, error) {
	var on RetryOn
	for _, n := range names {
		found := false
		for r := Reason429; r <= ReasonTimeout; r++ {
			if strings.EqualFold(n, r.String()) {
				on |= 1 << r
				found = true
			}
		}
		if !found {
			return 0, fmt.Errorf("unknown retry reason %q (known: 429, 5xx, connect, reset, timeout)", n)
		}
	}
	return on, nil
}

// Backoff computes Sturdy's own wait between attempts with full jitter.
type Backoff struct {
	// Base is the wait bound before the first retry; it doubles per retry.
	Base time.Duration
	// Max caps the bound; zero means no cap.
	Max time.Duration
}

// Delay returns the wait before retry n (n = 1 for the first retry): a
// uniform random duration in [0, min(Max, Base·2^(n-1))] ("full jitter").
// rnd(k) must return a uniform value in [0, k), like rand.Int64N.
func (b Backoff) Delay(n int, rnd func(int64) int64) time.Duration {
	bound := b.Bound(n)
	if bound <= 0 {
		return 0
	}
	return time.Duration(rnd(int64(bound) + 1))
}

// Bound returns the upper bound of Delay(n): min(Max, Base·2^(n-1)).
func (b Backoff) Bound(n int) time.Duration {
	if n < 1 || b.Base <= 0 {
		return 0
	}
	bound := b.Base
	for i := 1; i < n; i++ {
		if bound > (1<<62)/2 || (b.Max > 0 && bound >= b.Max) {
			break
		}
		bound *= 2
	}
	if b.Max > 0 && bound > b.Max {
		bound = b.Max
	}
	return bound
}

// Retry is a route's retry policy (`retry:` in the config).
type Retry struct {
	// MaxAttempts counts the first attempt; 1 disables retries.
	MaxAttempts int
	// Backoff is Sturdy's own wait when the server gives none.
	Backoff Backoff
	// MaxRetryAfter is the longest server-given wait Sturdy honours; a
	// longer one goes back to the client at once.
	MaxRetryAfter time.Duration
	// On is the set of reasons retried.
	On RetryOn
	// ReplayWrites retries non-replayable writes on every reason, not only
	// on connect.
	ReplayWrites bool
	// MaxTotalAttempts caps attempts across all of a route's targets; zero
	// means MaxAttempts.
	MaxTotalAttempts int
	// OnTimeoutFailover moves to the next target after a timeout instead
	// of retrying in place.
	OnTimeoutFailover bool
}

// Stop says why the attempt loop stops (StopNone: it does not).
type Stop uint8

// The reasons to stop trying.
const (
	StopNone Stop = iota
	// StopFinal: the outcome is not a failure to retry (success,
	// pass-through, client gone).
	StopFinal
	// StopNotOn: the failure's reason is not in `retry.on`.
	StopNotOn
	// StopNotReplayable: the request may have reached the upstream and is
	// not safe to send twice.
	StopNotReplayable
	// StopMaxAttempts: max_attempts reached.
	StopMaxAttempts
	// StopRetryAfterTooLong: the server asked for a wait above
	// max_retry_after.
	StopRetryAfterTooLong
	// StopDeadline: the wait would pass the route's deadline.
	StopDeadline
	// StopBreakerOpen: the upstream's breaker opened between attempts.
	StopBreakerOpen
	// StopBudget: the upstream's retry budget is spent.
	StopBudget
	// StopUnavailable: no target is left to try (breakers open, cooling
	// down after a 429, rate-limited or busy).
	StopUnavailable
)

// String returns the stop reason as logged.
func (s Stop) String() string {
	switch s {
	case StopFinal:
		return "final"
	case StopNotOn:
		return "not_in_retry_on"
	case StopNotReplayable:
		return "not_replayable"
	case StopMaxAttempts:
		return "max_attempts"
	case StopRetryAfterTooLong:
		return "retry_after_too_long"
	case StopDeadline:
		return "deadline"
	case StopBreakerOpen:
		return "breaker_open"
	case StopBudget:
		return "retry_budget"
	case StopUnavailable:
		return "no_target_available"
	default:
		return ""
	}
}

// Attempt is what the loop knows after one attempt, as input to Next.
type Attempt struct {
	// Verdict is the attempt's classification.
	Verdict Verdict
	// N is the number of attempts made on the current target, this one
	// included (≥ 1).
	N int
	// Total is the number of attempts made across all targets (≥ N).
	Total int
	// HasFallback is true when another target remains to fail over to.
	HasFallback bool
	// FailoverStatus is true when a pass-through reply matched the route's
	// failover_on statuses or failover_codes.
	FailoverStatus bool
	// BudgetSpent is true when the upstream's retry budget refused a retry
	// in place: the next target is tried if one may be, else Sturdy stops.
	BudgetSpent bool
	// Replayable is Replayable() of the request.
	Replayable bool
	// ServerWait is the wait the upstream asked for (Retry-After or
	// retry-after-ms); HasServerWait says whether it asked at all.
	ServerWait    time.Duration
	HasServerWait bool
	// Remaining is the time left until the route's deadline.
	Remaining time.Duration
}

// Step is the decision for what follows an attempt.
type Step struct {
	// Retry is true when another attempt on the same target follows
	// after Wait.
	Retry bool
	// Failover is true when the next target is tried (at once).
	Failover bool
	// Wait is how long to wait before the next attempt.
	Wait time.Duration
	// FromServer is true when Wait is the server's, not our backoff.
	FromServer bool
	// Stop says why no attempt follows, when Retry is false.
	Stop Stop
}

// Next decides what follows attempt a: a retry on the same target after
// a wait, a failover to the next target, or a stop. A caller whose retry
// budget refuses the retry Next chose asks again with a.BudgetSpent set. A server-given wait is
// used exactly; otherwise the full-jitter backoff draws one with rnd. A
// wait that would reach the deadline is never started. Where retrying in
// place must stop, the next target is tried instead if one is left, the
// request is safe to send elsewhere and max_total_attempts allows.
func (r Retry) Next(a Attempt, rnd func(int64) int64) Step {
	v := a.Verdict
	maxTotal := r.MaxTotalAttempts
	if maxTotal <= 0 {
		maxTotal = r.MaxAttempts
	}
	safe := a.Replayable || v.Reason == ReasonConnect || r.ReplayWrites
	canFailover := a.HasFallback && a.Total < maxTotal && a.Remaining > 0
	// orFailover moves to the next target when it can, else stops.
	orFailover := func(stop Step) Step {
		if canFailover && safe {
			return Step{Failover: true}
		}
		return stop
	}
	switch {
	case v.Class == ClassPassThrough && a.FailoverStatus && canFailover && a.Replayable:
		return Step{Failover: true}
	case v.Class != ClassRetryable:
		return Step{Stop: StopFinal}
	case !r.On.Has(v.Reason):
		return Step{Stop: StopNotOn}
	case !safe:
		return Step{Stop: StopNotReplayable}
	case a.Remaining <= 0:
		return Step{Stop: StopDeadline}
	case a.Total >= maxTotal:
		return Step{Stop: StopMaxAttempts}
	case v.Reason == ReasonTimeout && r.OnTimeoutFailover && canFailover:
		return Step{Failover: true}
	}
	if a.HasServerWait {
		switch {
		case a.ServerWait > r.MaxRetryAfter:
			return orFailover(Step{Stop: StopRetryAfterTooLong, Wait: a.ServerWait, FromServer: true})
		case a.ServerWait >= a.Remaining:
			return orFailover(Step{Stop: StopDeadline, Wait: a.ServerWait, FromServer: true})
		case a.N >= r.MaxAttempts:
			return orFailover(Step{Stop: StopMaxAttempts})
		case a.BudgetSpent:
			return orFailover(Step{Stop: StopBudget})
		}
		return Step{Retry: true, Wait: a.ServerWait, FromServer: true}
	}
	if a.N >= r.MaxAttempts {
		return orFailover(Step{Stop: StopMaxAttempts})
	}
	if a.BudgetSpent {
		return orFailover(Step{Stop: StopBudget})
	}
	wait := r.Backoff.Delay(a.N, rnd)
	if wait >= a.Remaining {
		return orFailover(Step{Stop: StopDeadline, Wait: wait})
	}
	return Step{Retry: true, Wait: wait}
}
