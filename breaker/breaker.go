// Package breaker gives each upstream a circuit breaker over
// github.com/sony/gobreaker/v2's TwoStepCircuitBreaker, with the trip rule
// Sturdy's config describes: N failures in a row, or a failure ratio over a
// rolling window once enough attempts completed.
//
// It does no logging: state changes are reported through
// Settings.OnStateChange.
//
// The files: breaker.go one Breaker (its trip rule, its own open time),
// group.go a bounded Group of them by key (an endpoint's per model).
package breaker

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
)

// State is a breaker's state: closed (traffic flows), open (fail fast) or
// half-open (a few probes go through).
type State = gobreaker.State

// The breaker states.
const (
	StateClosed   = gobreaker.StateClosed
	StateHalfOpen = gobreaker.StateHalfOpen
	StateOpen     = gobreaker.StateOpen
)

// Result is what one attempt tells the breaker.
type Result uint8

// The attempt results.
const (
	// Success: the upstream answered sensibly (2xx/3xx, pass-through 4xx).
	Success Result = iota
	// Failure: 5xx, connect, reset or timeout.
	Failure
	// Excluded: says nothing about health (429, client gone): neither
	// counted nor resetting a run of failures.
	Excluded
	// Unreachable: a failure where nothing answered the connection
	// (refused, dial timeout) — most often a server not up yet. A breaker
	// that opens on one stays open min(FirstOpen, OpenFor) first,
	// doubling after each failed probe up to OpenFor, so a model server
	// that starts late is used within about a second.
	Unreachable
)

// Settings configures a Breaker. A zero field means its default.
type Settings struct {
	// ConsecutiveFailures opens the breaker on the Nth failure in a row.
	// Default 5.
	ConsecutiveFailures uint32 `yaml:"consecutive_failures"`
	// FailureRatio opens the breaker when, within window, at least
	// min_requests attempts completed and failures ÷ completed ≥ the
	// ratio. Default 0.5.
	FailureRatio float64 `yaml:"failure_ratio"`
	// MinRequests is the number of completed attempts within window
	// before failure_ratio applies. Default 20.
	MinRequests uint32 `yaml:"min_requests"`
	// Window is the rolling window the counts cover. Default 30s.
	Window time.Duration `yaml:"window"`
	// OpenFor is how long the breaker stays open (failing fast with 503
	// circuit_open) before letting probes through. Opened on failed
	// connects, it stays open 1 s first, doubling per failed probe up to
	// this. Default 15s.
	OpenFor time.Duration `yaml:"open_for"`
	// HalfOpenRequests is the number of probes let through when half-open;
	// that many successes in a row close it, one failure opens it again.
	// Default 1.
	HalfOpenRequests uint32 `yaml:"half_open_requests"`
	// FirstOpen is how long the breaker first stays open when it opened
	// on an Unreachable failure (doubling per failed probe up to
	// OpenFor). Default 1 s.
	FirstOpen time.Duration `yaml:"-"`
	// OnStateChange, if set, is called on every transition. It runs under
	// the breaker's lock: it must not call back into the breaker.
	OnStateChange func(name string, from, to State) `yaml:"-"`
	// MayOpen, if set, is asked when the counts say to open the breaker
	// (closed to open only); false keeps it closed, and the next failure
	// asks again. It runs under the breaker's lock: it must not call back
	// into the breaker. A pool uses it to bound how many of its endpoints
	// are ejected at once.
	MayOpen func() bool `yaml:"-"`
}

// Defaults of Settings.
const (
	DefaultConsecutiveFailures = 5
	DefaultFailureRatio        = 0.5
	DefaultMinRequests         = 20
	DefaultWindow              = 30 * time.Second
	DefaultOpenFor             = 15 * time.Second
	DefaultHalfOpenRequests    = 1
	DefaultFirstOpen           = time.Second
)

// windowBuckets is the rolling window's resolution.
const windowBuckets = 10

var (
	errFailure  = errors.New("breaker: attempt failed")
	errExcluded = errors.New("breaker: attempt excluded")
)

// Breaker is one upstream's circuit breaker. It is safe for concurrent use.
//
// gobreaker's open time is fixed, so the breaker asks it for the
// shortest (FirstOpen, at most OpenFor) and holds itself open for as long as
// this open lasts: OpenFor, or after Unreachable failures a doubling
// backoff from firstOpen.
type Breaker struct {
	cb                 *gobreaker.TwoStepCircuitBreaker[struct{}]
	openFor, firstOpen time.Duration
	// until is when the current open ends (UnixNano): set on opening,
	// kept while half-open, 0 exactly while closed.
	until atomic.Int64
	// unreachable says the last failure was Unreachable; backoff is the
	// length of the next open after one (doubling up to openFor).
	unreachable atomic.Bool
	backoff     atomic.Int64
	// tripped holds the counts that last opened the breaker (gobreaker
	// clears its counts on every transition), cause what they were in
	// words; last is the latest failure's cause (DoneWith).
	tripped atomic.Pointer[gobreaker.Counts]
	cause   atomic.Pointer[string]
	last    atomic.Pointer[string]
}

// New returns a closed breaker named name.
func New(name string, s Settings) *Breaker {
	s = s.normalized()
	b := &Breaker{openFor: s.OpenFor, firstOpen: s.FirstOpen}
	b.backoff.Store(int64(s.FirstOpen))
	consecutive, minRequests, ratio, mayOpen := s.ConsecutiveFailures, s.MinRequests, s.FailureRatio, s.MayOpen
	bucket := max(s.Window/windowBuckets, time.Millisecond)
	b.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:         name,
		MaxRequests:  s.HalfOpenRequests,
		Interval:     s.Window,
		BucketPeriod: bucket,
		Timeout:      s.FirstOpen,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			completed := c.TotalSuccesses + c.TotalFailures
			trip := c.ConsecutiveFailures >= consecutive ||
				completed >= minRequests && float64(c.TotalFailures) >= ratio*float64(completed)
			if trip && (mayOpen == nil || mayOpen()) {
				b.tripped.Store(&c)
				b.cause.Store(b.describe(c, consecutive))
				return true
			}
			return false
		},
		OnStateChange: func(name string, from, to gobreaker.State) {
			b.changed(to)
			if s.OnStateChange != nil {
				s.OnStateChange(name, from, to)
			}
		},
		IsExcluded: func(err error) bool { return err == errExcluded },
	})
	return b
}

// changed keeps the breaker's own view of how long an open lasts: from
// a transition to open, OpenFor — or after an Unreachable failure the
// backoff, which doubles for the next; closing resets it.
func (b *Breaker) changed(to State) {
	now := time.Now()
	switch to {
	case gobreaker.StateOpen:
		d := b.openFor
		if b.unreachable.Load() {
			d = time.Duration(b.backoff.Load())
			b.backoff.Store(int64(min(2*d, b.openFor)))
		}
		b.until.Store(now.Add(d).UnixNano())
	case gobreaker.StateClosed:
		b.until.Store(0)
		b.backoff.Store(int64(b.firstOpen))
	}
}

// held reports whether the breaker is open by its own clock (gobreaker's
// shorter one may have passed). A breaker that is not open costs one
// atomic load: no clock read.
func (b *Breaker) held() bool {
	u := b.until.Load()
	return u != 0 && time.Now().UnixNano() < u
}

func (s Settings) normalized() Settings {
	if s.ConsecutiveFailures == 0 {
		s.ConsecutiveFailures = DefaultConsecutiveFailures
	}
	if s.FailureRatio <= 0 {
		s.FailureRatio = DefaultFailureRatio
	}
	if s.MinRequests == 0 {
		s.MinRequests = DefaultMinRequests
	}
	if s.Window <= 0 {
		s.Window = DefaultWindow
	}
	if s.OpenFor <= 0 {
		s.OpenFor = DefaultOpenFor
	}
	if s.HalfOpenRequests == 0 {
		s.HalfOpenRequests = DefaultHalfOpenRequests
	}
	if s.FirstOpen <= 0 {
		s.FirstOpen = DefaultFirstOpen
	}
	s.FirstOpen = min(s.FirstOpen, s.OpenFor)
	return s
}

// Ticket is an allowed attempt's pass: report its result with Done.
type Ticket struct {
	b      *Breaker
	report func(error)
}

// DoneWith is Done, with the failure's cause in a few words (a status,
// "connection refused", "timeout") for Cause to name; it is ignored for
// a result that is no failure.
func (t Ticket) DoneWith(r Result, cause string) {
	if (r == Failure || r == Unreachable) && cause != "" {
		c := cause // a copy: taking cause's own address would move it to the heap on every call
		t.b.last.Store(&c)
	}
	t.Done(r)
}

// Done reports the attempt's result, exactly once, as soon as it is known
// (at response headers, not at the end of a stream).
func (t Ticket) Done(r Result) {
	switch r {
	case Success:
		t.report(nil)
	case Failure:
		t.b.unreachable.Store(false)
		t.report(errFailure)
	case Unreachable:
		t.b.unreachable.Store(true)
		t.report(errFailure)
	default:
		t.report(errExcluded)
	}
}

// Allow asks whether an attempt may go to the upstream. When ok, the
// ticket's Done must be called once with the attempt's result. When not
// ok, the breaker is open (or half-open with all probes taken).
func (b *Breaker) Allow() (t Ticket, ok bool) {
	if b.held() {
		return Ticket{}, false
	}
	report, err := b.cb.Allow()
	if err != nil {
		return Ticket{}, false
	}
	return Ticket{b: b, report: report}, true
}

// ProbeIn returns how long until the open breaker lets a probe through;
// zero when it is not open (or the probe is due).
func (b *Breaker) ProbeIn(now time.Time) time.Duration {
	d := time.Duration(b.until.Load() - now.UnixNano())
	return max(d, 0) // 0 when not open (until is 0) or the probe is due
}

// State returns the breaker's current state. A closed one costs one
// atomic load (until is 0): it leaves closed only through a result, which
// sets until, so gobreaker's lock and clock are not needed to tell it.
func (b *Breaker) State() State {
	switch u := b.until.Load(); {
	case u == 0:
		return StateClosed
	case time.Now().UnixNano() < u:
		return StateOpen
	}
	return b.cb.State() // half-open, or open past its time: gobreaker moves it on
}

// describe says in words what the counts c that opened the breaker were,
// with the cause of the last failure when one was given.
func (b *Breaker) describe(c gobreaker.Counts, consecutive uint32) *string {
	s := fmt.Sprintf("%d of %d attempts failed", c.TotalFailures, c.TotalSuccesses+c.TotalFailures)
	if c.ConsecutiveFailures >= consecutive {
		s = fmt.Sprintf("%d consecutive failures", c.ConsecutiveFailures)
	}
	if last := b.last.Load(); last != nil {
		s += ", the last: " + *last
	}
	return &s
}

// Cause says what opened the breaker while it is not closed (e.g. "5
// consecutive failures, the last: 503"); "" when closed.
func (b *Breaker) Cause() string {
	if b.State() == StateClosed {
		return ""
	}
	if c := b.cause.Load(); c != nil {
		return *c
	}
	return ""
}

// TrippedOn returns the counts that last opened the breaker (ok false
// when it never opened): while open, Counts are zero.
func (b *Breaker) TrippedOn() (c gobreaker.Counts, ok bool) {
	if p := b.tripped.Load(); p != nil {
		return *p, true
	}
	return c, false
}

// Counts returns the breaker's counts in the current window.
func (b *Breaker) Counts() gobreaker.Counts { return b.cb.Counts() }
