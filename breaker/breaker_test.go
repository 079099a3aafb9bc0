package breaker

import (
	"sync"
	"testing"
	"time"
)

// report sends n attempts with result r through b and fails the test if
// one is refused.
func report(t *testing.T, b *Breaker, r Result, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		ticket, ok := b.Allow()
		if !ok {
			t.Fatalf("attempt %d of %d refused; state %v", i+1, n, b.State())
		}
		ticket.Done(r)
	}
}

func TestOpensOnNthConsecutiveFailure(t *testing.T) {
	b := New("u", Settings{ConsecutiveFailures: 3, MinRequests: 1000})
	report(t, b, Failure, 2)
	if b.State() != StateClosed {
		t.Fatalf("open after 2 failures; want closed until the 3rd")
	}
	report(t, b, Failure, 1)
	if b.State() != StateOpen {
		t.Fatalf("state %v after 3 failures, want open", b.State())
	}
	if _, ok := b.Allow(); ok {
		t.Fatal("open breaker allowed an attempt")
	}
}

func TestSuccessResetsTheRunButExclusionDoesNot(t *testing.T) {
	b := New("u", Settings{ConsecutiveFailures: 3, MinRequests: 1000})
	report(t, b, Failure, 2)
	report(t, b, Success, 1)
	report(t, b, Failure, 2)
	if b.State() != StateClosed {
		t.Fatal("a success did not reset the run of failures")
	}
	report(t, b, Excluded, 5)
	report(t, b, Failure, 1)
	if b.State() != StateOpen {
		t.Fatal("excluded results (429s) reset the run of failures; they must not")
	}
}

func TestOpensOnFailureRatioAfterMinRequests(t *testing.T) {
	b := New("u", Settings{ConsecutiveFailures: 100, FailureRatio: 0.5, MinRequests: 10, Window: time.Minute})
	for i := 0; i < 4; i++ { // 8 completed, 50 % failures: below min_requests
		report(t, b, Success, 1)
		report(t, b, Failure, 1)
	}
	report(t, b, Excluded, 10) // exclusions are not completed attempts
	if b.State() != StateClosed {
		t.Fatal("opened before min_requests completed")
	}
	report(t, b, Success, 1)
	report(t, b, Failure, 1) // 10 completed, 5 failures = 0.5
	if b.State() != StateOpen {
		t.Fatalf("state %v at 5/10 failures, want open", b.State())
	}
}

func TestHalfOpenProbesThenCloses(t *testing.T) {
	var mu sync.Mutex
	var transitions []string
	b := New("u", Settings{ConsecutiveFailures: 1, OpenFor: 50 * time.Millisecond, HalfOpenRequests: 2,
		OnStateChange: func(name string, from, to State) {
			mu.Lock()
			transitions = append(transitions, name+":"+from.String()+">"+to.String())
			mu.Unlock()
		}})
	report(t, b, Failure, 1)
	if in := b.ProbeIn(time.Now()); in <= 0 || in > 50*time.Millisecond {
		t.Fatalf("ProbeIn = %v, want (0, 50ms]", in)
	}
	deadline := time.Now().Add(2 * time.Second)
	for b.State() != StateHalfOpen {
		if time.Now().After(deadline) {
			t.Fatal("breaker never became half-open")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if b.ProbeIn(time.Now()) != 0 {
		t.Fatal("ProbeIn non-zero while half-open")
	}
	d1, ok1 := b.Allow()
	d2, ok2 := b.Allow()
	_, ok3 := b.Allow()
	if !ok1 || !ok2 || ok3 {
		t.Fatalf("half-open allowed %v %v %v; want exactly 2 probes", ok1, ok2, ok3)
	}
	d1.Done(Success)
	d2.Done(Success)
	if b.State() != StateClosed {
		t.Fatalf("state %v after 2 good probes, want closed", b.State())
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"u:closed>open", "u:open>half-open", "u:half-open>closed"}
	if len(transitions) != len(want) {
		t.Fatalf("transitions %v, want %v", transitions, want)
	}
	for i := range want {
		if transitions[i] != want[i] {
			t.Fatalf("transitions %v, want %v", transitions, want)
		}
	}
}

func TestFailedProbeReopens(t *testing.T) {
	b := New("u", Settings{ConsecutiveFailures: 1, OpenFor: 20 * time.Millisecond})
	report(t, b, Failure, 1)
	time.Sleep(40 * time.Millisecond)
	report(t, b, Failure, 1)
	if b.State() != StateOpen {
		t.Fatalf("state %v after a failed probe, want open", b.State())
	}
}

func TestDefaults(t *testing.T) {
	s := Settings{}.normalized()
	want := Settings{ConsecutiveFailures: 5, FailureRatio: 0.5, MinRequests: 20, Window: 30 * time.Second,
		OpenFor: 15 * time.Second, HalfOpenRequests: 1}
	if s.ConsecutiveFailures != want.ConsecutiveFailures || s.FailureRatio != want.FailureRatio ||
		s.MinRequests != want.MinRequests || s.Window != want.Window || s.OpenFor != want.OpenFor ||
		s.HalfOpenRequests != want.HalfOpenRequests {
		t.Fatalf("defaults %+v, want %+v", s, want)
	}
}

// TestAnUnreachableUpstreamIsProbedSoonThenLessOften: opened on refused
// connects, the breaker first stays open FirstOpen, doubling per failed
// probe up to OpenFor; opened on other failures, OpenFor.
func TestAnUnreachableUpstreamIsProbedSoonThenLessOften(t *testing.T) {
	s := Settings{ConsecutiveFailures: 1, MinRequests: 1000, FirstOpen: 40 * time.Millisecond, OpenFor: 200 * time.Millisecond}
	b := New("u", s)
	for _, want := range []time.Duration{40, 80, 160, 200, 200} {
		report(t, b, Unreachable, 1)
		if in := b.ProbeIn(time.Now()); b.State() != StateOpen || in > want*time.Millisecond || in < want*time.Millisecond-20*time.Millisecond {
			t.Fatalf("open for %v, want %vms (state %v)", in, want, b.State())
		}
		if _, ok := b.Allow(); ok {
			t.Fatal("an open breaker let an attempt through")
		}
		time.Sleep(b.ProbeIn(time.Now()) + 5*time.Millisecond)
		if b.State() != StateHalfOpen {
			t.Fatalf("state %v once the open ended, want half-open", b.State())
		}
	}
	report(t, b, Success, 1)
	if b.State() != StateClosed {
		t.Fatalf("state %v after the probe succeeded", b.State())
	}
	report(t, b, Unreachable, 1) // closed again: the backoff starts over
	if in := b.ProbeIn(time.Now()); in > 40*time.Millisecond {
		t.Fatalf("after closing, opened for %v, want the first open again", in)
	}
	other := New("v", s)
	report(t, other, Failure, 1)
	if in := other.ProbeIn(time.Now()); in < 180*time.Millisecond {
		t.Fatalf("opened on a 5xx-like failure for %v, want open_for", in)
	}
}

// TestCauseNamesWhatOpenedTheBreaker: while open, Cause says the counts
// that tripped it and the last failure's cause; closed, nothing.
func TestCauseNamesWhatOpenedTheBreaker(t *testing.T) {
	b := New("up", Settings{ConsecutiveFailures: 3, MinRequests: 1000, OpenFor: time.Minute})
	for i := 0; i < 3; i++ {
		tk, _ := b.Allow()
		tk.DoneWith(Failure, "503")
	}
	if got := b.Cause(); got != "3 consecutive failures, the last: 503" {
		t.Fatalf("cause %q", got)
	}
	ratio := New("up", Settings{ConsecutiveFailures: 100, MinRequests: 4, FailureRatio: 0.5, OpenFor: time.Minute})
	for _, r := range []Result{Success, Failure, Success, Unreachable} {
		tk, _ := ratio.Allow()
		tk.DoneWith(r, "connection refused")
	}
	if got := ratio.Cause(); got != "2 of 4 attempts failed, the last: connection refused" {
		t.Fatalf("cause %q", got)
	}
	if New("up", Settings{}).Cause() != "" {
		t.Fatal("a closed breaker has a cause")
	}
}

// TestASuccessfulResultDoesNotAllocate: reporting a success with a cause
// (an attempt's status, given whatever the result) costs no allocation;
// only a failure keeps its cause.
func TestASuccessfulResultDoesNotAllocate(t *testing.T) {
	b := New("up", Settings{})
	cause := "200"
	if n := testing.AllocsPerRun(100, func() {
		tk, ok := b.Allow()
		if !ok {
			t.Fatal("a closed breaker refused")
		}
		tk.DoneWith(Success, cause)
	}); n > 1 { // gobreaker's Allow returns a closure: one allocation of its own
		t.Fatalf("Allow and DoneWith(Success) cost %v allocations, want 1 (gobreaker's)", n)
	}
}
