package policy

import (
	"fmt"
	"strings"
	"time"
)

// RetryOn is the set of reasons a route retries on (`retry.on`). The zero
// value holds no reason; in a Retry it means the default, RetryOnAll.
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

// ParseOnTimeout turns `retry.on_timeout` ("failover", "retry", or ""
// for the default) into an OnTimeout; anything else is an error naming
// the two.
func ParseOnTimeout(name string) (OnTimeout, error) {
	switch name {
	case "":
		return OnTimeoutDefault, nil
	case "retry":
		return OnTimeoutRetry, nil
	case "failover":
		return OnTimeoutFailover, nil
	}
	return OnTimeoutDefault, fmt.Errorf("must be failover or retry (got %q)", name)
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

// OnTimeout says what follows an attempt that timed out.
type OnTimeout uint8

// The choices of `retry.on_timeout`.
const (
	// OnTimeoutDefault is OnTimeoutFailover when the route has a fallback,
	// else OnTimeoutRetry (see Retry.WithDefaults).
	OnTimeoutDefault OnTimeout = iota
	// OnTimeoutRetry retries in place.
	OnTimeoutRetry
	// OnTimeoutFailover moves to the next target.
	OnTimeoutFailover
)

// Defaults of Retry, filled by WithDefaults where a field is zero.
const (
	DefaultMaxAttempts   = 4
	DefaultBaseDelay     = 250 * time.Millisecond
	DefaultMaxDelay      = 8 * time.Second
	DefaultMaxRetryAfter = 30 * time.Second
)

// Retry is a route's retry policy, compiled from its retry: (proxy.Retry). A zero field
// means its default; WithDefaults fills them in.
type Retry struct {
	// MaxAttempts counts the first attempt on each target; 1 disables
	// retries. Default 4.
	MaxAttempts int
	// Backoff is Sturdy's own wait when the server gives none. Default
	// base 250 ms, max 8 s.
	Backoff Backoff
	// MaxRetryAfter is the longest server-given wait Sturdy honours; a
	// longer one goes back to the client at once. Default 30 s.
	MaxRetryAfter time.Duration
	// On is the set of reasons retried. Zero means RetryOnAll.
	On RetryOn
	// ReplayWrites retries non-replayable writes on every reason, not only
	// on connect.
	ReplayWrites bool
	// MaxTotalAttempts caps attempts across all of a route's targets.
	// Default MaxAttempts plus the number of fallbacks.
	MaxTotalAttempts int
	// OnTimeout says whether a timeout fails over or retries in place.
	// Default: fail over when there is a fallback.
	OnTimeout OnTimeout
}

// WithDefaults returns r with every zero field set to its default, for a
// route with the given number of fallbacks.
func (r Retry) WithDefaults(fallbacks int) Retry {
	if r.MaxAttempts <= 0 {
		r.MaxAttempts = DefaultMaxAttempts
	}
	if r.Backoff.Base <= 0 {
		r.Backoff.Base = DefaultBaseDelay
	}
	if r.Backoff.Max <= 0 {
		r.Backoff.Max = max(DefaultMaxDelay, r.Backoff.Base)
	}
	if r.MaxRetryAfter <= 0 {
		r.MaxRetryAfter = DefaultMaxRetryAfter
	}
	if r.On == 0 {
		r.On = RetryOnAll
	}
	if r.MaxTotalAttempts <= 0 {
		r.MaxTotalAttempts = r.MaxAttempts + fallbacks
	}
	if r.OnTimeout == OnTimeoutDefault {
		r.OnTimeout = OnTimeoutRetry
		if fallbacks > 0 {
			r.OnTimeout = OnTimeoutFailover
		}
	}
	return r
}
