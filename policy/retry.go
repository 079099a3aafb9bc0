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
	default:
		return ""
	}
}

// Attempt is what the loop knows after one attempt, as input to Next.
type Attempt struct {
	// Verdict is the attempt's classification.
	Verdict Verdict
	// N is the number of attempts made so far, this one included (≥ 1).
	N int
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
	// Retry is true when another attempt follows after Wait.
	Retry bool
	// Wait is how long to wait before the next attempt.
	Wait time.Duration
	// FromServer is true when Wait is the server's, not our backoff.
	FromServer bool
	// Stop says why no attempt follows, when Retry is false.
	Stop Stop
}

// Next decides whether a retry follows attempt a and how long to wait
// first. A server-given wait is used exactly; otherwise the full-jitter
// backoff draws one with rnd. A wait that would reach the deadline stops
// the loop instead of being waited for.
func (r Retry) Next(a Attempt, rnd func(int64) int64) Step {
	v := a.Verdict
	switch {
	case v.Class != ClassRetryable:
		return Step{Stop: StopFinal}
	case !r.On.Has(v.Reason):
		return Step{Stop: StopNotOn}
	case !a.Replayable && v.Reason != ReasonConnect && !r.ReplayWrites:
		return Step{Stop: StopNotReplayable}
	case a.N >= r.MaxAttempts:
		return Step{Stop: StopMaxAttempts}
	}
	if a.HasServerWait {
		if a.ServerWait > r.MaxRetryAfter {
			return Step{Stop: StopRetryAfterTooLong, Wait: a.ServerWait, FromServer: true}
		}
		if a.ServerWait >= a.Remaining {
			return Step{Stop: StopDeadline, Wait: a.ServerWait, FromServer: true}
		}
		return Step{Retry: true, Wait: a.ServerWait, FromServer: true}
	}
	wait := r.Backoff.Delay(a.N, rnd)
	if wait >= a.Remaining {
		return Step{Stop: StopDeadline, Wait: wait}
	}
	return Step{Retry: true, Wait: wait}
}
