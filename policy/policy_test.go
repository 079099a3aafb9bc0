package policy

import (
	"testing"
	"time"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		in   Outcome
		want Verdict
	}{
		{"200 success", Outcome{Status: 200}, Verdict{ClassSuccess, ReasonNone, HealthSuccess}},
		{"304 success", Outcome{Status: 304}, Verdict{ClassSuccess, ReasonNone, HealthSuccess}},
		{"400 pass-through counts as success", Outcome{Status: 400}, Verdict{ClassPassThrough, ReasonNone, HealthSuccess}},
		{"404 pass-through", Outcome{Status: 404}, Verdict{ClassPassThrough, ReasonNone, HealthSuccess}},
		{"422 pass-through", Outcome{Status: 422}, Verdict{ClassPassThrough, ReasonNone, HealthSuccess}},
		{"429 retryable, excluded from breaker", Outcome{Status: 429}, Verdict{ClassRetryable, Reason429, HealthExcluded}},
		{"429 insufficient_quota passes through", Outcome{Status: 429, InsufficientQuota: true}, Verdict{ClassPassThrough, ReasonNone, HealthExcluded}},
		{"500 retryable failure", Outcome{Status: 500}, Verdict{ClassRetryable, Reason5xx, HealthFailure}},
		{"503 retryable failure", Outcome{Status: 503}, Verdict{ClassRetryable, Reason5xx, HealthFailure}},
		{"529 retryable failure", Outcome{Status: 529}, Verdict{ClassRetryable, Reason5xx, HealthFailure}},
		{"connect", Outcome{Fault: FaultConnect}, Verdict{ClassRetryable, ReasonConnect, HealthFailure}},
		{"reset", Outcome{Fault: FaultReset}, Verdict{ClassRetryable, ReasonReset, HealthFailure}},
		{"timeout", Outcome{Fault: FaultTimeout}, Verdict{ClassRetryable, ReasonTimeout, HealthFailure}},
		{"fault wins over a stale status", Outcome{Status: 200, Fault: FaultReset}, Verdict{ClassRetryable, ReasonReset, HealthFailure}},
		{"client gone", Outcome{Fault: FaultClientGone}, Verdict{ClassClientGone, ReasonNone, HealthExcluded}},
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
		{`not json insufficient_quota`, false},
		{``, false},
	}
	for _, tt := range tests {
		if got := InsufficientQuota([]byte(tt.body)); got != tt.want {
			t.Errorf("InsufficientQuota(%s) = %v, want %v", tt.body, got, tt.want)
		}
	}
}

// nextCase is one row of a Retry.Next table.
type nextCase struct {
	name   string
	policy Retry
	in     Attempt
	want   Step
}

func runNextTable(t *testing.T, tests []nextCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.policy.Next(tt.in, maxRand); got != tt.want {
				t.Errorf("Next = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestRetryNext(t *testing.T) {
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
	tests := []nextCase{
		{"success stops", r, Attempt{Verdict: Classify(Outcome{Status: 200}), N: 1, Replayable: true, Remaining: hour}, Step{Stop: StopFinal}},
		{"pass-through stops", r, Attempt{Verdict: Classify(Outcome{Status: 400}), N: 1, Replayable: true, Remaining: hour}, Step{Stop: StopFinal}},
		{"5xx retries with jitter bound", r, Attempt{Verdict: v5xx, N: 1, Replayable: true, Remaining: hour}, Step{Retry: true, Wait: 250 * time.Millisecond}},
		{"third retry bound is 1s", r, Attempt{Verdict: v5xx, N: 3, Replayable: true, Remaining: hour}, Step{Retry: true, Wait: time.Second}},
		{"max attempts reached", r, Attempt{Verdict: v5xx, N: 4, Replayable: true, Remaining: hour}, Step{Stop: StopMaxAttempts}},
		{"max_attempts 1 never retries", Retry{MaxAttempts: 1, On: RetryOnAll}, Attempt{Verdict: v5xx, N: 1, Replayable: true, Remaining: hour}, Step{Stop: StopMaxAttempts}},
		{"retry-after honoured exactly", r, Attempt{Verdict: v429, N: 1, Replayable: true, ServerWait: 3 * time.Second, HasServerWait: true, Remaining: hour}, Step{Retry: true, Wait: 3 * time.Second, FromServer: true}},
		{"retry-after zero", r, Attempt{Verdict: v429, N: 1, Replayable: true, HasServerWait: true, Remaining: hour}, Step{Retry: true, FromServer: true}},
		{"retry-after too long", r, Attempt{Verdict: v429, N: 1, Replayable: true, ServerWait: time.Minute, HasServerWait: true, Remaining: hour}, Step{Stop: StopRetryAfterTooLong, Wait: time.Minute, FromServer: true}},
		{"retry-after past deadline", r, Attempt{Verdict: v5xx, N: 1, Replayable: true, ServerWait: 5 * time.Second, HasServerWait: true, Remaining: 4 * time.Second}, Step{Stop: StopDeadline, Wait: 5 * time.Second, FromServer: true}},
		{"backoff past deadline", r, Attempt{Verdict: v5xx, N: 1, Replayable: true, Remaining: 100 * time.Millisecond}, Step{Stop: StopDeadline, Wait: 250 * time.Millisecond}},
		{"deadline already passed", r, Attempt{Verdict: v5xx, N: 1, Replayable: true, Remaining: -time.Second}, Step{Stop: StopDeadline}},
		{"write not replayed on 5xx", r, Attempt{Verdict: v5xx, N: 1, Replayable: false, Remaining: hour}, Step{Stop: StopNotReplayable}},
		{"write not replayed on reset", r, Attempt{Verdict: vReset, N: 1, Replayable: false, Remaining: hour}, Step{Stop: StopNotReplayable}},
		{"write retried on connect", r, Attempt{Verdict: vConnect, N: 1, Replayable: false, Remaining: hour}, Step{Retry: true, Wait: 250 * time.Millisecond}},
		{"replay_writes retries writes", Retry{MaxAttempts: 2, On: RetryOnAll, ReplayWrites: true}, Attempt{Verdict: v5xx, N: 1, Remaining: hour}, Step{Retry: true}},
		{"reason not in retry.on", Retry{MaxAttempts: 4, On: 1 << ReasonConnect}, Attempt{Verdict: v5xx, N: 1, Replayable: true, Remaining: hour}, Step{Stop: StopNotOn}},
	}
	runNextTable(t, tests)
}

func TestRetryNextFailover(t *testing.T) {
	r := Retry{MaxAttempts: 2, MaxTotalAttempts: 4, Backoff: Backoff{Base: 250 * time.Millisecond, Max: time.Second},
		MaxRetryAfter: 30 * time.Second, On: RetryOnAll}
	withTimeoutFailover := r
	withTimeoutFailover.OnTimeoutFailover = true
	v5xx := Classify(Outcome{Status: 503})
	v429 := Classify(Outcome{Status: 429})
	vTimeout := Classify(Outcome{Fault: FaultTimeout})
	v404 := Classify(Outcome{Status: 404})
	hour := time.Hour
	tests := []nextCase{
		{"retry in place first", r, Attempt{Verdict: v5xx, N: 1, Total: 1, Replayable: true, HasFallback: true, Remaining: hour},
			Step{Retry: true, Wait: 250 * time.Millisecond}},
		{"target exhausted moves on", r, Attempt{Verdict: v5xx, N: 2, Total: 2, Replayable: true, HasFallback: true, Remaining: hour},
			Step{Failover: true}},
		{"no fallback left stops", r, Attempt{Verdict: v5xx, N: 2, Total: 2, Replayable: true, Remaining: hour},
			Step{Stop: StopMaxAttempts}},
		{"total budget across targets", r, Attempt{Verdict: v5xx, N: 1, Total: 4, Replayable: true, HasFallback: true, Remaining: hour},
			Step{Stop: StopMaxAttempts}},
		{"retry-after too long fails over", r, Attempt{Verdict: v429, N: 1, Total: 1, Replayable: true, HasFallback: true,
			ServerWait: time.Minute, HasServerWait: true, Remaining: hour}, Step{Failover: true}},
		{"retry-after past deadline fails over", r, Attempt{Verdict: v429, N: 1, Total: 1, Replayable: true, HasFallback: true,
			ServerWait: 5 * time.Second, HasServerWait: true, Remaining: 2 * time.Second}, Step{Failover: true}},
		{"timeout fails over when on_timeout is failover", withTimeoutFailover, Attempt{Verdict: vTimeout, N: 1, Total: 1, Replayable: true,
			HasFallback: true, Remaining: hour}, Step{Failover: true}},
		{"timeout retried in place otherwise", r, Attempt{Verdict: vTimeout, N: 1, Total: 1, Replayable: true, HasFallback: true, Remaining: hour},
			Step{Retry: true, Wait: 250 * time.Millisecond}},
		{"failover_on 404 fails over", r, Attempt{Verdict: v404, N: 1, Total: 1, Replayable: true, HasFallback: true, FailoverStatus: true,
			Remaining: hour}, Step{Failover: true}},
		{"failover_on 404 without fallback passes through", r, Attempt{Verdict: v404, N: 1, Total: 1, Replayable: true, FailoverStatus: true,
			Remaining: hour}, Step{Stop: StopFinal}},
		{"plain 404 passes through", r, Attempt{Verdict: v404, N: 1, Total: 1, Replayable: true, HasFallback: true, Remaining: hour},
			Step{Stop: StopFinal}},
		{"write that reached the server never fails over", r, Attempt{Verdict: v5xx, N: 2, Total: 2, HasFallback: true, Remaining: hour},
			Step{Stop: StopNotReplayable}},
		{"budget spent fails over", r, Attempt{Verdict: v5xx, N: 1, Total: 1, Replayable: true, HasFallback: true, BudgetSpent: true,
			Remaining: hour}, Step{Failover: true}},
		{"budget spent without fallback stops", r, Attempt{Verdict: v5xx, N: 1, Total: 1, Replayable: true, BudgetSpent: true,
			Remaining: hour}, Step{Stop: StopBudget}},
		{"budget spent on a server wait stops", r, Attempt{Verdict: v429, N: 1, Total: 1, Replayable: true, BudgetSpent: true,
			ServerWait: time.Second, HasServerWait: true, Remaining: hour}, Step{Stop: StopBudget}},
		{"deadline passed: no failover", r, Attempt{Verdict: v5xx, N: 2, Total: 2, Replayable: true, HasFallback: true, Remaining: 0},
			Step{Stop: StopDeadline}},
	}
	runNextTable(t, tests)
}

func TestBudgetAbsorbsTransientFaultsButCapsAnOutage(t *testing.T) {
	start := time.Unix(1_000_000, 0)
	// 20 % faults at 100 req/s: ~25 retries/s needed, all granted.
	b := &Budget{Ratio: 0.5, MinPerSecond: 10}
	denied := 0
	for ms := 0; ms < 30_000; ms += 10 { // 100 requests per second for 30 s
		now := start.Add(time.Duration(ms) * time.Millisecond)
		b.FirstAttempt(now)
		if ms%40 == 0 && !b.TryRetry(now) { // a retry for every 4th request
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
			if b.TryRetry(now) {
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
		if b.TryRetry(now) {
			granted++
		}
	}
	if granted != 20 { // 2 per second over the 10 s window
		t.Fatalf("granted %d, want 20", granted)
	}
	if !b.TryRetry(now.Add(11 * time.Second)) {
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
	if d, ok := ClientTimeout([]byte("600"), nil); !ok || d != 10*time.Minute {
		t.Errorf("X-Stainless-Timeout 600 = %v %v", d, ok)
	}
	if d, ok := ClientTimeout(nil, []byte("2.5")); !ok || d != 2500*time.Millisecond {
		t.Errorf("decimal seconds = %v %v", d, ok)
	}
	if d, ok := ClientTimeout([]byte("nope"), []byte("-1"), []byte("3")); !ok || d != 3*time.Second {
		t.Errorf("first valid header = %v %v", d, ok)
	}
	if _, ok := ClientTimeout(nil, []byte("0")); ok {
		t.Error("zero timeout accepted")
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
