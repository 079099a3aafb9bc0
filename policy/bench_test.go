package policy

import (
	"testing"
	"time"
)

func BenchmarkClassify(b *testing.B) {
	b.ReportAllocs()
	outcomes := []Outcome{{Status: 200}, {Status: 404}, {Status: 429}, {Status: 503}, {Fault: FaultReset}}
	for i := 0; i < b.N; i++ {
		_ = Classify(outcomes[i%len(outcomes)])
	}
}

func BenchmarkReplayable(b *testing.B) {
	b.ReportAllocs()
	m, p := []byte("POST"), []byte("/v1/chat/completions")
	for i := 0; i < b.N; i++ {
		_ = Replayable(m, p, false)
	}
}

func BenchmarkDecide(b *testing.B) {
	b.ReportAllocs()
	r := Retry{MaxAttempts: 4, Backoff: Backoff{Base: 250 * time.Millisecond, Max: 8 * time.Second}, MaxRetryAfter: 30 * time.Second, On: RetryOnAll}
	a := Attempt{Verdict: Classify(Outcome{Status: 503}), N: 1, Total: 1, Replayable: true, Remaining: time.Minute}
	for i := 0; i < b.N; i++ {
		_ = r.Decide(a, maxRand)
	}
}

func BenchmarkBudget(b *testing.B) {
	b.ReportAllocs()
	bu := &Budget{Ratio: 0.5, MinPerSecond: 10}
	now := time.Now()
	for i := 0; i < b.N; i++ {
		bu.FirstAttempt(now)
		if bu.Reserve(now) {
			bu.Cancel(now)
		}
	}
}
