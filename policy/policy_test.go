package policy

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		in   Outcome
		want Verdict
	}{
		{"200 success", Outcome{Status: 200}, Verdict{ClassSuccess, ReasonNone, HealthSuccess, HealthSuccess}},
		{"304 success", Outcome{Status: 304}, Verdict{ClassSuccess, ReasonNone, HealthSuccess, HealthSuccess}},
		{"400 pass-through counts as success", Outcome{Status: 400}, Verdict{ClassPassThrough, ReasonNone, HealthSuccess, HealthSuccess}},
		{"404 pass-through", Outcome{Status: 404}, Verdict{ClassPassThrough, ReasonNone, HealthSuccess, HealthSuccess}},
		{"422 pass-through", Outcome{Status: 422}, Verdict{ClassPassThrough, ReasonNone, HealthSuccess, HealthSuccess}},
		{"429 retryable, excluded from breaker", Outcome{Status: 429}, Verdict{ClassRetryable, Reason429, HealthExcluded, HealthSuccess}},
		{"429 insufficient_quota passes through", Outcome{Status: 429, InsufficientQuota: true}, Verdict{ClassPassThrough, ReasonNone, HealthExcluded, HealthSuccess}},
		{"500: the reply breaker's, the connection worked", Outcome{Status: 500}, Verdict{ClassRetryable, Reason5xx, HealthFailure, HealthSuccess}},
		{"508 loop detected: a config mistake, never retried", Outcome{Status: 508}, Verdict{ClassPassThrough, ReasonNone, HealthExcluded, HealthSuccess}},
		{"503 retryable failure", Outcome{Status: 503}, Verdict{ClassRetryable, Reason5xx, HealthFailure, HealthSuccess}},
		{"529 retryable failure", Outcome{Status: 529}, Verdict{ClassRetryable, Reason5xx, HealthFailure, HealthSuccess}},
		{"connect: the connection breaker's", Outcome{Fault: FaultConnect}, Verdict{ClassRetryable, ReasonConnect, HealthExcluded, HealthUnreachable}},
		{"reset", Outcome{Fault: FaultReset}, Verdict{ClassRetryable, ReasonReset, HealthExcluded, HealthFailure}},
		{"timeout: the reply breaker's", Outcome{Fault: FaultTimeout}, Verdict{ClassRetryable, ReasonTimeout, HealthFailure, HealthExcluded}},
		{"fault wins over a stale status", Outcome{Status: 200, Fault: FaultReset}, Verdict{ClassRetryable, ReasonReset, HealthExcluded, HealthFailure}},
		{"client gone", Outcome{Fault: FaultClientGone}, Verdict{ClassClientGone, ReasonNone, HealthExcluded, HealthExcluded}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Classify(tt.in); got != tt.want {
				t.Errorf("Classify(%+v) = %+v, want %+v", tt.in, got, tt.want)
			}
		})
	}
}

func TestReplayable(t *testing.T) {
	tests := []struct {
		method, path string
		idem         bool
		want         bool
	}{
		{"GET", "/v1/models", false, true},
		{"HEAD", "/", false, true},
		{"OPTIONS", "/v1/chat/completions", false, true},
		{"POST", "/v1/chat/completions", false, true},
		{"POST", "/v1/chat/completions/", false, true},
		{"POST", "/v1/completions", false, true},
		{"POST", "/v1/embeddings", false, true},
		{"POST", "/v1/responses", false, true},
		{"POST", "/v1/moderations", false, true},
		{"POST", "/api/chat", false, true},
		{"POST", "/api/generate", false, true},
		{"POST", "/api/embed", false, true},
		{"POST", "/api/embeddings", false, true},
		{"POST", "/v1/files", false, false},
		{"POST", "/v1/batches", false, false},
		{"POST", "/v1/fine_tuning/jobs", false, false},
		{"POST", "/v1/responses/resp_1/cancel", false, false},
		{"POST", "/v1/files", true, true},
		{"DELETE", "/v1/files/f1", false, false},
		{"PUT", "/v1/thing", false, false},
		{"PATCH", "/v1/thing", true, true},
	}
	for _, tt := range tests {
		if got := Replayable([]byte(tt.method), []byte(tt.path), tt.idem); got != tt.want {
			t.Errorf("Replayable(%s %s, idem=%v) = %v, want %v", tt.method, tt.path, tt.idem, got, tt.want)
		}
	}
}

func TestParseRetryOn(t *testing.T) {
	on, err := ParseRetryOn([]string{"429", "5xx", "connect", "reset", "timeout"})
	if err != nil || on != RetryOnAll {
		t.Fatalf("all reasons: got %b, %v", on, err)
	}
	on, err = ParseRetryOn([]string{"connect"})
	if err != nil || !on.Has(ReasonConnect) || on.Has(Reason5xx) {
		t.Fatalf("connect only: got %b, %v", on, err)
	}
	if _, err := ParseRetryOn([]string{"4xx"}); err == nil {
		t.Fatal("4xx accepted, want error")
	}
}

// maxRand always draws the top of the range, minRand the bottom.
func maxRand(n int64) int64 { return n - 1 }
func minRand(int64) int64   { return 0 }

func TestBackoffBoundAndJitter(t *testing.T) {
	b := Backoff{Base: 250 * time.Millisecond, Max: 8 * time.Second}
	wantBounds := []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second,
		4 * time.Second, 8 * time.Second, 8 * time.Second, 8 * time.Second}
	for n, want := range wantBounds {
		if got := b.Bound(n); got != want {
			t.Errorf("Bound(%d) = %v, want %v", n, got, want)
		}
		if got := b.Delay(n, maxRand); got != want {
			t.Errorf("Delay(%d, max) = %v, want %v", n, got, want)
		}
		if got := b.Delay(n, minRand); got != 0 {
			t.Errorf("Delay(%d, min) = %v, want 0", n, got)
		}
	}
	if got := b.Bound(10_000); got != 8*time.Second {
		t.Errorf("Bound(10000) = %v, want the cap", got)
	}
	uncapped := Backoff{Base: time.Second}
	if got := uncapped.Bound(200); got <= 0 {
		t.Errorf("uncapped Bound(200) overflowed to %v", got)
	}
	// A seeded draw stays inside [0, bound] over many retries.
	var seed uint64 = 42
	rnd := func(n int64) int64 {
		seed = seed*6364136223846793005 + 1442695040888963407
		return int64(seed>>1) % n
	}
	for i := 0; i < 10_000; i++ {
		n := 1 + i%8
		if d := b.Delay(n, rnd); d < 0 || d > b.Bound(n) {
			t.Fatalf("Delay(%d) = %v outside [0, %v]", n, d, b.Bound(n))
		}
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name       string
		ms, header string
		want       time.Duration
		ok         bool
	}{
		{"none", "", "", 0, false},
		{"seconds", "", "3", 3 * time.Second, true},
		{"zero seconds", "", "0", 0, true},
		{"seconds with spaces", "", " 7 ", 7 * time.Second, true},
		{"http date", "", "Mon, 30 Nov 2026 12:00:05 GMT", 5 * time.Second, true},
		{"http date in the past", "", "Mon, 30 Nov 2026 11:00:00 GMT", 0, true},
		{"ms only", "1500", "", 1500 * time.Millisecond, true},
		{"fractional ms", "20.5", "", 20500 * time.Microsecond, true},
		{"ms wins over seconds", "200", "10", 200 * time.Millisecond, true},
		{"bad ms falls back to seconds", "soon", "2", 2 * time.Second, true},
		{"negative ms ignored", "-5", "", 0, false},
		{"negative seconds ignored", "", "-5", 0, false},
		{"garbage", "", "tomorrow", 0, false},
		{"huge seconds clamp", "", "99999999999999999999", maxServerWait, true},
		{"huge ms clamp", "1e300", "", maxServerWait, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := RetryAfter([]byte(tt.ms), []byte(tt.header), now)
			if got != tt.want || ok != tt.ok {
				t.Errorf("RetryAfter(%q, %q) = %v, %v; want %v, %v", tt.ms, tt.header, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestInsufficientQuota(t *testing.T) {
	tests := []struct {
		body string
		want bool
	}{
		{`{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`, true},
		{`{"error": {"code": "insufficient_quota"}}`, true},
		{`{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`, false},
		{`{"error":{"message":"insufficient_quota is not my code","code":"rate_limit_exceeded"}}`, false},
		{`{"type":"error","error":{"type":"billing_error","message":"Your credit balance is too low"}}`, true},
		{`{"type":"error","error":{"type":"invalid_request_error","message":"billing_error is not my type"}}`, false},
		{`not json insufficient_quota`, false},
		{``, false},
	}
	for _, tt := range tests {
		if got := InsufficientQuota([]byte(tt.body)); got != tt.want {
			t.Errorf("InsufficientQuota(%s) = %v, want %v", tt.body, got, tt.want)
		}
	}
}

// decideCase is one row of a Retry.Decide table.
type decideCase struct {
	name   string
	policy Retry
	in     Attempt
	want   Decision
}

func runDecideTable(t *testing.T, tests []decideCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.policy.Decide(tt.in, maxRand); got != tt.want {
				t.Errorf("Decide = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// Shorthands for the decisions in the tables.
func retryAfter(d time.Duration) Decision {
	return Decision{Action: ActionAttempt, Wait: d, Source: WaitBackoff}
}
func serverWait(d time.Duration) Decision {
	return Decision{Action: ActionAttempt, Wait: d, Source: WaitServer}
}
func stopWith(s Stop) Decision     { return Decision{Action: ActionStop, Stop: s} }
func failoverWith(s Stop) Decision { return Decision{Action: ActionFailover, Stop: s} }

func TestDecide(t *testing.T) {
	r := Retry{
		MaxAttempts:   4,
		Backoff:       Backoff{Base: 250 * time.Millisecond, Max: 8 * time.Second},
		MaxRetryAfter: 30 * time.Second,
		On:            RetryOnAll,
	}
	v5xx := Classify(Outcome{Status: 503})
	v429 := Classify(Outcome{Status: 429})
	vConnect := Classify(Outcome{Fault: FaultConnect})
	vReset := Classify(Outcome{Fault: FaultReset})
	hour := time.Hour
	tests := []decideCase{
		{"success stops", r, Attempt{Verdict: Classify(Outcome{Status: 200}), N: 1, Replayable: true, Remaining: hour}, stopWith(StopFinal)},
		{"pass-through stops", r, Attempt{Verdict: Classify(Outcome{Status: 400}), N: 1, Replayable: true, Remaining: hour}, stopWith(StopFinal)},
		{"client gone stops", r, Attempt{Verdict: Classify(Outcome{Fault: FaultClientGone}), N: 1, Replayable: true, Remaining: hour, HasFallback: true}, stopWith(StopClientGone)},
		{"5xx retries with jitter bound", r, Attempt{Verdict: v5xx, N: 1, Replayable: true, Remaining: hour}, retryAfter(250 * time.Millisecond)},
		{"third retry bound is 1s", r, Attempt{Verdict: v5xx, N: 3, Replayable: true, Remaining: hour}, retryAfter(time.Second)},
		{"max attempts reached", r, Attempt{Verdict: v5xx, N: 4, Replayable: true, Remaining: hour}, stopWith(StopMaxAttempts)},
		{"max_attempts 1 never retries", Retry{MaxAttempts: 1, On: RetryOnAll}, Attempt{Verdict: v5xx, N: 1, Replayable: true, Remaining: hour}, stopWith(StopMaxAttempts)},
		{"retry-after honoured exactly", r, Attempt{Verdict: v429, N: 1, Replayable: true, ServerWait: 3 * time.Second, HasServerWait: true, Remaining: hour}, serverWait(3 * time.Second)},
		{"retry-after zero", r, Attempt{Verdict: v429, N: 1, Replayable: true, HasServerWait: true, Remaining: hour}, serverWait(0)},
		{"retry-after too long", r, Attempt{Verdict: v429, N: 1, Replayable: true, ServerWait: time.Minute, HasServerWait: true, Remaining: hour}, stopWith(StopRetryAfterTooLong)},
		{"retry-after past deadline", r, Attempt{Verdict: v5xx, N: 1, Replayable: true, ServerWait: 5 * time.Second, HasServerWait: true, Remaining: 4 * time.Second}, stopWith(StopDeadline)},
		{"retry-after at max attempts", r, Attempt{Verdict: v429, N: 4, Replayable: true, ServerWait: time.Second, HasServerWait: true, Remaining: hour}, stopWith(StopMaxAttempts)},
		{"backoff past deadline", r, Attempt{Verdict: v5xx, N: 1, Replayable: true, Remaining: 100 * time.Millisecond}, stopWith(StopDeadline)},
		{"deadline already passed", r, Attempt{Verdict: v5xx, N: 1, Replayable: true, Remaining: -time.Second}, stopWith(StopDeadline)},
		{"write not replayed on 5xx", r, Attempt{Verdict: v5xx, N: 1, Replayable: false, Remaining: hour}, stopWith(StopNotReplayable)},
		{"write not replayed on reset", r, Attempt{Verdict: vReset, N: 1, Replayable: false, Remaining: hour}, stopWith(StopNotReplayable)},
		{"write retried on connect", r, Attempt{Verdict: vConnect, N: 1, Replayable: false, Remaining: hour}, retryAfter(250 * time.Millisecond)},
		{"replay_writes retries writes", Retry{MaxAttempts: 2, On: RetryOnAll, ReplayWrites: true}, Attempt{Verdict: v5xx, N: 1, Remaining: hour}, retryAfter(0)},
		{"reason not in retry.on", Retry{MaxAttempts: 4, On: 1 << ReasonConnect}, Attempt{Verdict: v5xx, N: 1, Replayable: true, Remaining: hour}, stopWith(StopNotOn)},
	}
	runDecideTable(t, tests)
}

func TestDecideFailover(t *testing.T) {
	r := Retry{MaxAttempts: 2, MaxTotalAttempts: 4, Backoff: Backoff{Base: 250 * time.Millisecond, Max: time.Second},
		MaxRetryAfter: 30 * time.Second, On: RetryOnAll, OnTimeout: OnTimeoutRetry}
	withTimeoutFailover := r
	withTimeoutFailover.OnTimeout = OnTimeoutFailover
	v5xx := Classify(Outcome{Status: 503})
	v429 := Classify(Outcome{Status: 429})
	vTimeout := Classify(Outcome{Fault: FaultTimeout})
	v404 := Classify(Outcome{Status: 404})
	hour := time.Hour
	tests := []decideCase{
		{"retry in place first", r, Attempt{Verdict: v5xx, N: 1, Total: 1, Replayable: true, HasFallback: true, Remaining: hour},
			retryAfter(250 * time.Millisecond)},
		{"target exhausted moves on", r, Attempt{Verdict: v5xx, N: 2, Total: 2, Replayable: true, HasFallback: true, Remaining: hour},
			failoverWith(StopMaxAttempts)},
		{"no fallback left stops", r, Attempt{Verdict: v5xx, N: 2, Total: 2, Replayable: true, Remaining: hour},
			stopWith(StopMaxAttempts)},
		{"total budget across targets", r, Attempt{Verdict: v5xx, N: 1, Total: 4, Replayable: true, HasFallback: true, Remaining: hour},
			stopWith(StopMaxTotalAttempts)},
		{"retry-after too long fails over", r, Attempt{Verdict: v429, N: 1, Total: 1, Replayable: true, HasFallback: true,
			ServerWait: time.Minute, HasServerWait: true, Remaining: hour}, failoverWith(StopRetryAfterTooLong)},
		{"retry-after past deadline fails over", r, Attempt{Verdict: v429, N: 1, Total: 1, Replayable: true, HasFallback: true,
			ServerWait: 5 * time.Second, HasServerWait: true, Remaining: 2 * time.Second}, failoverWith(StopDeadline)},
		{"timeout fails over when on_timeout is failover", withTimeoutFailover, Attempt{Verdict: vTimeout, N: 1, Total: 1, Replayable: true,
			HasFallback: true, Remaining: hour}, Decision{Action: ActionFailover}},
		{"timeout retried in place otherwise", r, Attempt{Verdict: vTimeout, N: 1, Total: 1, Replayable: true, HasFallback: true, Remaining: hour},
			retryAfter(250 * time.Millisecond)},
		{"on_timeout failover without fallback retries", withTimeoutFailover, Attempt{Verdict: vTimeout, N: 1, Total: 1, Replayable: true,
			Remaining: hour}, retryAfter(250 * time.Millisecond)},
		{"failover_on 404 fails over", r, Attempt{Verdict: v404, N: 1, Total: 1, Replayable: true, HasFallback: true, FailoverStatus: true,
			Remaining: hour}, Decision{Action: ActionFailover}},
		{"failover_on 404 without fallback passes through", r, Attempt{Verdict: v404, N: 1, Total: 1, Replayable: true, FailoverStatus: true,
			Remaining: hour}, stopWith(StopFinal)},
		{"failover_on never sends a write elsewhere", r, Attempt{Verdict: v404, N: 1, Total: 1, HasFallback: true, FailoverStatus: true,
			Remaining: hour}, stopWith(StopFinal)},
		{"plain 404 passes through", r, Attempt{Verdict: v404, N: 1, Total: 1, Replayable: true, HasFallback: true, Remaining: hour},
			stopWith(StopFinal)},
		{"write that reached the server never fails over", r, Attempt{Verdict: v5xx, N: 2, Total: 2, HasFallback: true, Remaining: hour},
			stopWith(StopNotReplayable)},
		{"budget spent fails over", r, Attempt{Verdict: v5xx, N: 1, Total: 1, Replayable: true, HasFallback: true, BudgetSpent: true,
			Remaining: hour}, failoverWith(StopBudget)},
		{"budget spent without fallback stops", r, Attempt{Verdict: v5xx, N: 1, Total: 1, Replayable: true, BudgetSpent: true,
			Remaining: hour}, stopWith(StopBudget)},
		{"budget spent on a server wait stops", r, Attempt{Verdict: v429, N: 1, Total: 1, Replayable: true, BudgetSpent: true,
			ServerWait: time.Second, HasServerWait: true, Remaining: hour}, stopWith(StopBudget)},
		{"budget spent does not matter at max attempts", r, Attempt{Verdict: v5xx, N: 2, Total: 2, Replayable: true, BudgetSpent: true,
			Remaining: hour}, stopWith(StopMaxAttempts)},
		{"deadline passed: no failover", r, Attempt{Verdict: v5xx, N: 2, Total: 2, Replayable: true, HasFallback: true, Remaining: 0},
			stopWith(StopDeadline)},
	}
	runDecideTable(t, tests)
}

func TestDecideStale(t *testing.T) {
	r := Retry{MaxAttempts: 1, MaxTotalAttempts: 3, Backoff: Backoff{Base: 250 * time.Millisecond}, On: RetryOnAll}
	onlyConnect := Retry{MaxAttempts: 2, On: 1 << ReasonConnect}
	stale := Classify(Outcome{Fault: FaultStale})
	hour := time.Hour
	replay := Decision{Action: ActionAttempt, Replay: true}
	tests := []decideCase{
		{"replayed at once, even at max_attempts 1", r, Attempt{Verdict: stale, N: 1, Total: 1, Replayable: true, Remaining: hour}, replay},
		{"replayed whatever retry.on says", onlyConnect, Attempt{Verdict: stale, N: 1, Total: 1, Replayable: true, Remaining: hour}, replay},
		{"replayed even with the budget spent", r, Attempt{Verdict: stale, N: 1, Total: 1, Replayable: true, BudgetSpent: true, Remaining: hour}, replay},
		{"takes no attempt another target needs: past max_total_attempts", r, Attempt{Verdict: stale, N: 1, Total: 3, Replayable: true,
			HasFallback: true, Remaining: hour}, replay},
		{"not past the deadline", r, Attempt{Verdict: stale, N: 1, Total: 1, Replayable: true, Remaining: 0}, stopWith(StopDeadline)},
		{"a second one in a row is a reset", r, Attempt{Verdict: stale, N: 1, Total: 2, AfterStale: true, Replayable: true, Remaining: hour},
			stopWith(StopMaxAttempts)},
		{"a second one retried as a reset", Retry{MaxAttempts: 2, MaxTotalAttempts: 3, Backoff: Backoff{Base: time.Second}, On: RetryOnAll},
			Attempt{Verdict: stale, N: 1, Total: 2, AfterStale: true, Replayable: true, Remaining: hour}, retryAfter(time.Second)},
		{"a write is not replayed", r, Attempt{Verdict: stale, N: 1, Total: 1, Remaining: hour}, stopWith(StopNotReplayable)},
	}
	runDecideTable(t, tests)
	if replay.SpendsBudget() || !retryAfter(0).SpendsBudget() || stopWith(StopBudget).SpendsBudget() {
		t.Error("only a retry in place that is not a stale replay spends the budget")
	}
	if v := Classify(Outcome{Fault: FaultStale}); v.Health != HealthExcluded || v.Reason != ReasonStale {
		t.Fatalf("a stale connection must not count against the breaker: %+v", v)
	}
}

func TestDecideRidingThrough(t *testing.T) {
	r := Retry{MaxAttempts: 1, MaxTotalAttempts: 1, On: RetryOnAll}
	connect, reset := Classify(Outcome{Fault: FaultConnect}), Classify(Outcome{Fault: FaultReset})
	hour := time.Hour
	ride := Decision{Action: ActionAttempt, Ride: true}
	tests := []decideCase{
		{"a probe that could not connect rides on, past every count", r,
			Attempt{Verdict: connect, N: 1, Total: 1, Riding: true, BudgetSpent: true, Remaining: hour}, ride},
		{"a write too: it was never sent", r, Attempt{Verdict: connect, N: 1, Total: 1, Riding: true, Remaining: hour}, ride},
		{"not past the deadline", r, Attempt{Verdict: connect, N: 1, Total: 1, Riding: true, Replayable: true}, stopWith(StopDeadline)},
		{"a reset may have been seen: counted as ever", r,
			Attempt{Verdict: reset, N: 1, Total: 1, Riding: true, Replayable: true, Remaining: hour}, stopWith(StopMaxAttempts)},
		{"not riding: counted as ever", r, Attempt{Verdict: connect, N: 1, Total: 1, Replayable: true, Remaining: hour},
			stopWith(StopMaxAttempts)},
	}
	runDecideTable(t, tests)
	if ride.SpendsBudget() {
		t.Error("riding on spends no retry budget")
	}
}

func TestDecideRetryElsewhereAtOnce(t *testing.T) {
	r := Retry{MaxAttempts: 3, Backoff: Backoff{Base: time.Second, Max: 8 * time.Second}, MaxRetryAfter: time.Minute, On: RetryOnAll}
	hour := time.Hour
	v5xx, v429 := Classify(Outcome{Status: 502}), Classify(Outcome{Status: 429})
	tests := []decideCase{
		{"another replica: no backoff", r, Attempt{Verdict: v5xx, N: 1, Total: 1, Replayable: true, Elsewhere: true, Remaining: hour},
			Decision{Action: ActionAttempt, Source: WaitBackoff}},
		{"a server's wait still wins", r, Attempt{Verdict: v429, N: 1, Total: 1, Replayable: true, Elsewhere: true, Remaining: hour,
			ServerWait: 2 * time.Second, HasServerWait: true}, Decision{Action: ActionAttempt, Wait: 2 * time.Second, Source: WaitServer}},
		{"max_attempts still bounds it", r, Attempt{Verdict: v5xx, N: 3, Total: 3, Replayable: true, Elsewhere: true, Remaining: hour},
			stopWith(StopMaxAttempts)},
		{"the budget still bounds it", r, Attempt{Verdict: v5xx, N: 1, Total: 1, Replayable: true, Elsewhere: true, BudgetSpent: true,
			Remaining: hour}, stopWith(StopBudget)},
	}
	runDecideTable(t, tests)
}

// TestDecideTheFirstRequestAfterAFailure: what follows the attempt an
// agent meets right after something broke — no backoff before a failover
// already decided, no attempt left unused by a stale replay, a refused
// target ridden through when nothing else can answer.
func TestDecideTheFirstRequestAfterAFailure(t *testing.T) {
	r := Retry{MaxAttempts: 4, MaxTotalAttempts: 5, Backoff: Backoff{Base: time.Second, Max: 8 * time.Second},
		MaxRetryAfter: 30 * time.Second, On: RetryOnAll}
	hour := time.Hour
	connect, v5xx, v429 := Classify(Outcome{Fault: FaultConnect}), Classify(Outcome{Status: 503}), Classify(Outcome{Status: 429})
	failover := Decision{Action: ActionFailover}
	tests := []decideCase{
		{"every endpoint refused, a fallback left: at once", r,
			Attempt{Verdict: connect, N: 1, Total: 1, Refused: true, HasFallback: true, Remaining: hour}, failover},
		{"a write refused fails over too: it never left", r,
			Attempt{Verdict: connect, N: 1, Total: 1, Refused: true, HasFallback: true, Remaining: hour}, failover},
		{"refused, no fallback, ride_through: ride, uncounted", r,
			Attempt{Verdict: connect, N: 1, Total: 5, Refused: true, RideLeft: 4 * time.Second, Replayable: true, Remaining: hour},
			Decision{Action: ActionAttempt, Ride: true, Wait: time.Second, Source: WaitBackoff}},
		{"refused, no fallback, no ride: retried as ever", r,
			Attempt{Verdict: connect, N: 1, Total: 1, Refused: true, Replayable: true, Remaining: hour}, retryAfter(time.Second)},
		{"refused, another endpoint left: not Refused, retried elsewhere", r,
			Attempt{Verdict: connect, N: 1, Total: 1, Elsewhere: true, HasFallback: true, Replayable: true, Remaining: hour},
			Decision{Action: ActionAttempt, Source: WaitBackoff}},
		{"the probe failed, the target is out, a fallback left: at once", r,
			Attempt{Verdict: v5xx, N: 1, Total: 1, Out: true, HasFallback: true, Replayable: true, Remaining: hour},
			Decision{Action: ActionFailover, Stop: StopBreakerOpen}},
		{"the target is out, nothing left: stop at once", r,
			Attempt{Verdict: v5xx, N: 1, Total: 1, Out: true, Replayable: true, Remaining: hour}, stopWith(StopBreakerOpen)},
		{"the target is out, ride_through: retried (the loop rides)", r,
			Attempt{Verdict: v5xx, N: 1, Total: 1, Out: true, RideLeft: time.Second, Replayable: true, Remaining: hour}, retryAfter(time.Second)},
		{"a bare 429's cooldown, a fallback left: at once", r,
			Attempt{Verdict: v429, N: 1, Total: 1, Cooldown: time.Second, HasFallback: true, Replayable: true, Remaining: hour}, failover},
		{"a bare 429's cooldown, nothing left: wait it out", Retry{MaxAttempts: 4, Backoff: Backoff{Base: time.Millisecond}, On: RetryOnAll,
			MaxRetryAfter: 30 * time.Second}, Attempt{Verdict: v429, N: 1, Total: 1, Cooldown: 2 * time.Second, Replayable: true, Remaining: hour},
			Decision{Action: ActionAttempt, Wait: 2 * time.Second, Source: WaitBackoff}},
		{"a server's wait is waited even with a fallback", r,
			Attempt{Verdict: v429, N: 1, Total: 1, HasServerWait: true, ServerWait: 2 * time.Second, HasFallback: true, Replayable: true,
				Remaining: hour}, serverWait(2 * time.Second)},
		{"the last of max_total_attempts", r, Attempt{Verdict: v5xx, N: 1, Total: 5, Replayable: true, Remaining: hour},
			stopWith(StopMaxTotalAttempts)},
		{"one target's max_attempts", Retry{MaxAttempts: 2, On: RetryOnAll}, Attempt{Verdict: v5xx, N: 2, Total: 2, Replayable: true,
			Remaining: hour}, stopWith(StopMaxAttempts)},
	}
	runDecideTable(t, tests)
}

func TestClear(t *testing.T) {
	hour := time.Hour
	tests := []struct {
		name string
		in   Gate
		want Decision
	}{
		{"nothing in the way", Gate{Remaining: hour}, Decision{Action: ActionAttempt}},
		{"cooldown waited without a fallback", Gate{Obstacle: ObstacleCooldown, Wait: time.Second, MaxWait: 30 * time.Second, Remaining: hour},
			Decision{Action: ActionAttempt, Wait: time.Second, Source: WaitCooldown}},
		{"cooldown with a fallback fails over", Gate{Obstacle: ObstacleCooldown, Wait: time.Second, MaxWait: 30 * time.Second, Remaining: hour, HasFallback: true},
			Decision{Action: ActionFailover}},
		{"cooldown above max_retry_after refuses", Gate{Obstacle: ObstacleCooldown, Wait: time.Minute, MaxWait: 30 * time.Second, Remaining: hour},
			stopWith(StopNone)},
		{"cooldown past the deadline refuses", Gate{Obstacle: ObstacleCooldown, Wait: 2 * time.Second, MaxWait: 30 * time.Second, Remaining: time.Second},
			stopWith(StopNone)},
		{"cooldown after attempts elsewhere", Gate{Obstacle: ObstacleCooldown, Wait: time.Minute, MaxWait: 30 * time.Second, Remaining: hour, Total: 2},
			stopWith(StopUnavailable)},
		{"pacing waited even with a fallback", Gate{Obstacle: ObstaclePacing, Wait: time.Second, MaxWait: 2 * time.Second, Remaining: hour, HasFallback: true},
			Decision{Action: ActionAttempt, Wait: time.Second, Source: WaitPacing}},
		{"pacing no wait", Gate{Obstacle: ObstaclePacing, MaxWait: 2 * time.Second, Remaining: hour},
			Decision{Action: ActionAttempt, Source: WaitPacing}},
		{"pacing past max_wait fails over", Gate{Obstacle: ObstaclePacing, Wait: 3 * time.Second, MaxWait: 2 * time.Second, Remaining: hour, HasFallback: true},
			Decision{Action: ActionFailover}},
		{"pacing at the deadline refuses", Gate{Obstacle: ObstaclePacing, Wait: time.Second, MaxWait: 2 * time.Second, Remaining: time.Second},
			stopWith(StopNone)},
		{"pacing with the deadline passed refuses", Gate{Obstacle: ObstaclePacing, MaxWait: 2 * time.Second, Remaining: 0},
			stopWith(StopNone)},
		{"open breaker fails over", Gate{Obstacle: ObstacleBreaker, Wait: time.Second, Remaining: hour, HasFallback: true},
			Decision{Action: ActionFailover}},
		{"open breaker is never waited for", Gate{Obstacle: ObstacleBreaker, Wait: time.Millisecond, MaxWait: 0, Remaining: hour},
			stopWith(StopNone)},
		{"breaker opened between retries", Gate{Obstacle: ObstacleBreaker, Wait: time.Second, Remaining: hour, N: 2, Total: 2},
			stopWith(StopBreakerOpen)},
		{"busy fails over", Gate{Obstacle: ObstacleBusy, Remaining: hour, HasFallback: true}, Decision{Action: ActionFailover}},
		{"busy refuses", Gate{Obstacle: ObstacleBusy, Remaining: hour}, stopWith(StopNone)},
		{"busy after attempts elsewhere", Gate{Obstacle: ObstacleBusy, Remaining: hour, Total: 1}, stopWith(StopUnavailable)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Clear(tt.in); got != tt.want {
				t.Errorf("Clear = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestRetryWithDefaults(t *testing.T) {
	def := Retry{}.WithDefaults(0)
	want := Retry{MaxAttempts: 4, Backoff: Backoff{Base: 250 * time.Millisecond, Max: 8 * time.Second}, MaxRetryAfter: 30 * time.Second,
		On: RetryOnAll, MaxTotalAttempts: 4, OnTimeout: OnTimeoutRetry}
	if def != want {
		t.Errorf("defaults %+v, want %+v", def, want)
	}
	withFallbacks := Retry{MaxAttempts: 2}.WithDefaults(3)
	if withFallbacks.MaxTotalAttempts != 5 || withFallbacks.OnTimeout != OnTimeoutFailover {
		t.Errorf("with fallbacks: %+v", withFallbacks)
	}
	set := Retry{MaxAttempts: 1, Backoff: Backoff{Base: 10 * time.Second}, MaxRetryAfter: time.Second, On: 1 << ReasonConnect,
		MaxTotalAttempts: 9, OnTimeout: OnTimeoutRetry}
	got := set.WithDefaults(2)
	set.Backoff.Max = 10 * time.Second // the cap is never below the base
	if got != set {
		t.Errorf("explicit values changed: %+v, want %+v", got, set)
	}
}

func TestEveryStopHasANameAndText(t *testing.T) {
	for s := StopNotOn; s <= StopClientGone; s++ {
		if s.String() == "" || s.Text() == "" || !s.Ended() {
			t.Errorf("stop %d: name %q, text %q", s, s.String(), s.Text())
		}
	}
	if StopNone.Ended() || StopFinal.Ended() || Stop(200).String() != "" {
		t.Error("StopNone/StopFinal/out of range")
	}
}

// tryRetry takes a retry from the budget and keeps it, as the loop does
// for a retry it sends.
func tryRetry(b *Budget, now time.Time) bool { return b.Reserve(now) }

func TestBudgetCancelGivesTheRetryBack(t *testing.T) {
	b := &Budget{Ratio: 0, MinPerSecond: 0.1} // one retry per 10 s window
	now := time.Unix(7_000, 0)
	if !b.Reserve(now) || b.Reserve(now) {
		t.Fatal("want exactly one retry")
	}
	b.Cancel(now)
	if !b.Reserve(now) {
		t.Fatal("a cancelled retry was not given back")
	}
	b.Cancel(now)
	b.Cancel(now) // more cancels than reservations never go below zero
	if !b.Reserve(now) || b.Reserve(now) {
		t.Fatal("cancel went below zero")
	}
}

func TestBudgetAbsorbsTransientFaultsButCapsAnOutage(t *testing.T) {
	start := time.Unix(1_000_000, 0)
	// 20 % faults at 100 req/s: ~25 retries/s needed, all granted.
	b := &Budget{Ratio: 0.5, MinPerSecond: 10}
	denied := 0
	for ms := 0; ms < 30_000; ms += 10 { // 100 requests per second for 30 s
		now := start.Add(time.Duration(ms) * time.Millisecond)
		b.FirstAttempt(now)
		if ms%40 == 0 && !tryRetry(b, now) { // a retry for every 4th request
			denied++
		}
	}
	if denied != 0 {
		t.Fatalf("%d retries denied at a 25 %% retry rate", denied)
	}
	// An outage: every request wants 3 retries; the budget caps them at
	// ratio × requests + min_per_second × window.
	b = &Budget{Ratio: 0.5, MinPerSecond: 10}
	var firsts, retries int
	for ms := 0; ms < 30_000; ms += 10 {
		now := start.Add(time.Duration(ms) * time.Millisecond)
		b.FirstAttempt(now)
		firsts++
		for i := 0; i < 3; i++ {
			if tryRetry(b, now) {
				retries++
			}
		}
	}
	// 100 requests/s: the bound is 1 + ratio + min_per_second / rate = 1.6.
	if amp := float64(firsts+retries) / float64(firsts); amp > 1.6+0.01 {
		t.Fatalf("amplification %.2f during an outage", amp)
	}
	if retries == 0 {
		t.Fatal("no retries at all during an outage")
	}
}

func TestBudgetMinPerSecondWithoutTraffic(t *testing.T) {
	b := &Budget{Ratio: 0, MinPerSecond: 2}
	now := time.Unix(5_000, 0)
	granted := 0
	for i := 0; i < 100; i++ {
		if tryRetry(b, now) {
			granted++
		}
	}
	if granted != 20 { // 2 per second over the 10 s window
		t.Fatalf("granted %d, want 20", granted)
	}
	if !tryRetry(b, now.Add(11*time.Second)) {
		t.Fatal("budget did not refill after the window")
	}
}

func TestGlobMatch(t *testing.T) {
	tests := []struct {
		pattern, name string
		want          bool
	}{
		{"gpt-4o*", "gpt-4o", true},
		{"gpt-4o*", "gpt-4o-mini", true},
		{"gpt-4o*", "gpt-4", false},
		{"*", "", true},
		{"*", "anything/at all", true},
		{"meta-llama/*", "meta-llama/Llama-3.1-8B", true},
		{"llama3.?", "llama3.1", true},
		{"llama3.?", "llama3.10", false},
		{"*-mini", "gpt-4o-mini", true},
		{"a*b*c", "aXbYc", true},
		{"a*b*c", "aXbY", false},
		{"exact", "exact", true},
		{"exact", "exactly", false},
		{"", "", true},
		{"", "x", false},
	}
	for _, tt := range tests {
		if got := GlobMatch(tt.pattern, tt.name); got != tt.want {
			t.Errorf("GlobMatch(%q, %q) = %v, want %v", tt.pattern, tt.name, got, tt.want)
		}
	}
	if GlobSpecificity("gpt-4o-mini*") <= GlobSpecificity("gpt-4o*") || GlobSpecificity("*") != 0 {
		t.Error("specificity does not rank longer literals first")
	}
}

func TestClientTimeoutAndRateLimitHeaders(t *testing.T) {
	b := func(s string) []byte { return []byte(s) }
	for _, tc := range []struct {
		name                             string
		stainless, lang, read, req, xreq []byte
		want                             ClientTimeouts
	}{
		{"Node SDKs: until the head", b("600"), b("js"), nil, nil, nil, ClientTimeouts{Head: 10 * time.Minute}},
		{"Go SDK: in all", b("600"), b("go"), nil, nil, nil, ClientTimeouts{Total: 10 * time.Minute}},
		{"Python SDK: a read timeout, until the head; decimals", nil, b("python"), b("2.5"), nil, nil, ClientTimeouts{Head: 2500 * time.Millisecond}},
		{"Request-Timeout: in all, the least", nil, nil, nil, b("30"), b("20"), ClientTimeouts{Total: 20 * time.Second}},
		{"not numbers, zero, negative: none", b("nope"), b("js"), b("0"), b("-1"), nil, ClientTimeouts{}},
	} {
		if got := ClientTimeout(tc.stainless, tc.lang, tc.read, tc.req, tc.xreq); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
	if Margin(3*time.Second) != 300*time.Millisecond || Margin(time.Second) != 100*time.Millisecond || Margin(time.Hour) != 2*time.Second {
		t.Error("Margin")
	}
	for _, tc := range []struct {
		remaining, reset string
		want             time.Duration
		ok               bool
	}{
		{"0", "1s", time.Second, true},
		{"0", "6m0s", 6 * time.Minute, true},
		{"0", "20ms", 20 * time.Millisecond, true},
		{"0", "2", 2 * time.Second, true},
		{"5", "1s", 0, false},
		{"", "1s", 0, false},
		{"0", "later", 0, false},
	} {
		d, ok := RateLimitExhausted([]byte(tc.remaining), []byte(tc.reset))
		if d != tc.want || ok != tc.ok {
			t.Errorf("RateLimitExhausted(%q, %q) = %v %v, want %v %v", tc.remaining, tc.reset, d, ok, tc.want, tc.ok)
		}
	}
	if RequestedRetries([]byte("2")) != 2 || RequestedRetries(nil) != 0 || RequestedRetries([]byte("x")) != 0 {
		t.Error("RequestedRetries")
	}
}

func TestALocalFaultIsRetriedButNotTheUpstreamsFault(t *testing.T) {
	if v := Classify(Outcome{Fault: FaultLocal}); v.Class != ClassRetryable || v.Reason != ReasonConnect || v.Health != HealthExcluded {
		t.Fatalf("%+v", v)
	}
}

func TestModelKeyIsBoundedAndKeepsLongNamesApart(t *testing.T) {
	long := strings.Repeat("m", 4<<20)
	tests := []struct {
		name, model string
		same        bool // the key is the model itself
	}{
		{"empty", "", true},
		{"plain", "llama3.1", true},
		{"at the bound", strings.Repeat("x", MaxModelBytes), true},
		{"one past", strings.Repeat("x", MaxModelBytes+1), false},
		{"4 MiB", long, false},
		{"multi-byte at the cut", strings.Repeat("é", MaxModelBytes), false},
	}
	for _, tt := range tests {
		k := ModelKey(tt.model)
		if (k == tt.model) != tt.same || len(k) > MaxModelBytes || !utf8.ValidString(k) {
			t.Errorf("%s: key of %d bytes (valid UTF-8 %v), same %v", tt.name, len(k), utf8.ValidString(k), k == tt.model)
		}
		if k != ModelKey(tt.model) {
			t.Errorf("%s: not stable", tt.name)
		}
	}
	if ModelKey(long) == ModelKey(long+"n") {
		t.Error("two long names with one prefix share a key")
	}
	if !strings.HasPrefix(ModelKey(long), "mmmm") || !strings.Contains(ModelKey(long), "…") {
		t.Errorf("a long name's key does not show its start: %q", ModelKey(long)[:32])
	}
}

// TestAnthropicLimitExhausted: a pair with remaining 0 waits until its
// RFC 3339 reset, counted from the reply's Date; anything else, or a
// reset already past, is no wait.
func TestAnthropicLimitExhausted(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	date := []byte("Wed, 02 Dec 2026 12:00:10 GMT") // the server's clock, 10 s ahead of ours
	for _, tt := range []struct {
		name                   string
		remaining, reset, date string
		want                   time.Duration
		ok                     bool
	}{
		{"exhausted, counted from Date", "0", "2026-12-02T12:00:40Z", string(date), 30 * time.Second, true},
		{"exhausted, no Date", "0", "2026-12-02T12:00:40Z", "", 40 * time.Second, true},
		{"an offset", "0", "2026-12-02T13:00:40+01:00", "", 40 * time.Second, true},
		{"some left", "3", "2026-12-02T12:00:40Z", "", 0, false},
		{"reset passed", "0", "2026-12-02T12:00:05Z", string(date), 0, false},
		{"not RFC 3339", "0", "30s", "", 0, false},
		{"absent", "", "", "", 0, false},
		{"a year at most", "0", "2999-01-01T00:00:00Z", "", maxServerWait, true},
	} {
		d, ok := AnthropicLimitExhausted([]byte(tt.remaining), []byte(tt.reset), []byte(tt.date), now)
		if d != tt.want || ok != tt.ok {
			t.Errorf("%s: %v, %v; want %v, %v", tt.name, d, ok, tt.want, tt.ok)
		}
	}
}

func TestVerdictLabel(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		v    Verdict
		want string
	}{
		{Verdict{Class: ClassRetryable, Reason: Reason5xx}, Reason5xx.String()},
		{Verdict{Class: ClassRetryable, Reason: ReasonTimeout}, ReasonTimeout.String()},
		{Verdict{Class: ClassSuccess}, ClassSuccess.String()},
		{Verdict{Class: ClassPassThrough, Reason: Reason5xx}, ClassPassThrough.String()},
	} {
		if got := tt.v.Label(); got != tt.want {
			t.Errorf("%+v: %q, want %q", tt.v, got, tt.want)
		}
	}
}

func TestParseOnTimeout(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		want OnTimeout
		bad  bool
	}{{"", OnTimeoutDefault, false}, {"retry", OnTimeoutRetry, false}, {"failover", OnTimeoutFailover, false}, {"panic", OnTimeoutDefault, true}} {
		if got, err := ParseOnTimeout(tt.name); got != tt.want || (err != nil) != tt.bad {
			t.Errorf("%q: %v, %v", tt.name, got, err)
		}
	}
}

func TestOverloadedAndWhatTheReplyBreakerHears(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		o          Outcome
		ownTimeout bool
		overloaded bool
		adaptive   Health // what the reply breaker hears with an adaptive limit
	}{
		{"503", Outcome{Status: 503}, true, true, HealthExcluded},
		{"529", Outcome{Status: 529}, true, true, HealthExcluded},
		{"429 is the quota, not the load", Outcome{Status: 429}, true, false, HealthExcluded},
		{"500", Outcome{Status: 500}, true, false, HealthFailure},
		{"200", Outcome{Status: 200}, true, false, HealthSuccess},
		{"a failed connection", Outcome{Fault: FaultConnect}, true, true, HealthExcluded},
		{"its own timeout", Outcome{Fault: FaultTimeout}, true, true, HealthFailure},
		{"the request's deadline", Outcome{Fault: FaultTimeout}, false, false, HealthFailure},
		{"a reset", Outcome{Fault: FaultReset}, true, false, HealthExcluded},
		{"vLLM's overloaded engine, in band", Outcome{Status: 200, StreamFailed: true, StreamError: "503"}, true, true, HealthExcluded},
		{"Anthropic's overloaded_error, in band", Outcome{Status: 200, StreamFailed: true, StreamError: "overloaded_error"}, true, true, HealthExcluded},
		{"another error event", Outcome{Status: 200, StreamFailed: true, StreamError: "server_error"}, true, false, HealthFailure},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := Overloaded(tc.o, tc.ownTimeout); got != tc.overloaded {
				t.Fatalf("Overloaded = %v, want %v", got, tc.overloaded)
			}
			v := Classify(tc.o)
			if got := v.ReplyHealth(tc.o, true); got != tc.adaptive {
				t.Fatalf("adaptive: the reply breaker hears %v, want %v", got, tc.adaptive)
			}
			if got := v.ReplyHealth(tc.o, false); got != v.Health {
				t.Fatalf("not adaptive: the reply breaker hears %v, want the verdict's %v", got, v.Health)
			}
		})
	}
}
