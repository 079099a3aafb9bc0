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

// judged are the events a stream's head is judged on, per API: framing,
// content, usage.
// event is a stream event as events.Next reads it.
type event struct{ Name, Data []byte }

var judged = []struct {
	api API
	ev  event
}{
	{APIChat, event{Data: []byte(`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`)}},
	{APIChat, event{Data: []byte(`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}`)}},
	{APIChat, event{Data: []byte(`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"t","function":{"name":"f","arguments":""}}]},"finish_reason":null}]}`)}},
	{APIResponses, event{Name: []byte("response.created"), Data: []byte(`{"type":"response.created","response":{"id":"r1","status":"in_progress"}}`)}},
	{APIAnthropic, event{Name: []byte("message_start"), Data: []byte(`{"type":"message_start","message":{"id":"m","content":[]}}`)}},
	{APIAnthropic, event{Name: []byte("content_block_start"), Data: []byte(`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)}},
	{APIAnthropic, event{Name: []byte("content_block_delta"), Data: []byte(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`)}},
	{APIResponses, event{Name: []byte("response.output_item.added"), Data: []byte(`{"type":"response.output_item.added","item":{"type":"message","content":[]}}`)}},
	{APIResponses, event{Name: []byte("response.content_part.added"), Data: []byte(`{"type":"response.content_part.added","part":{"type":"output_text","text":""}}`)}},
	{APIResponses, event{Name: []byte("response.output_text.delta"), Data: []byte(`{"type":"response.output_text.delta","delta":"Hi"}`)}},
	{APIOllama, event{Data: []byte(`{"model":"m","message":{"role":"assistant","content":"Hi"},"done":false}`)}},
}

func BenchmarkJudge(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		j := judged[i%len(judged)]
		_, _ = Judge(j.api, j.ev.Name, j.ev.Data)
	}
}

// pool is a balance decision's input: four endpoints, one ramping up,
// one already failed on.
var pool = []Candidate{{Load: 3, Weight: 1, ID: 1}, {Load: 1, Weight: 0.4, ID: 2}, {Load: 2, Weight: 1, ID: 3, Tried: true},
	{Load: 0, Weight: 1, ID: 4}}

func BenchmarkPick(b *testing.B) {
	for _, p := range []struct {
		name string
		pick func(i int) int
	}{
		{"least_requests", func(int) int { return PickLeastRequests(pool, maxRand) }},
		{"round_robin", func(i int) int { return PickRoundRobin(pool, uint64(i), maxRand) }},
		{"affinity", func(i int) int { return PickAffinity(pool, uint64(i)*0x9e3779b97f4a7c15) }},
	} {
		b.Run(p.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				_ = p.pick(i)
			}
		})
	}
}

// TestHotDecisionsDoNotAllocate guards what runs on every request:
// classifying an attempt, deciding what follows it, judging a stream
// event at the commit point, picking an endpoint.
func TestHotDecisionsDoNotAllocate(t *testing.T) {
	r := Retry{MaxAttempts: 4, Backoff: Backoff{Base: 250 * time.Millisecond, Max: 8 * time.Second}, MaxRetryAfter: 30 * time.Second, On: RetryOnAll}
	a := Attempt{Verdict: Classify(Outcome{Status: 503}), N: 1, Total: 1, Replayable: true, Remaining: time.Minute}
	for name, f := range map[string]func(){
		"Classify": func() { _ = Classify(Outcome{Status: 503}) },
		"Decide":   func() { _ = r.Decide(a, maxRand) },
		"Judge": func() {
			for _, j := range judged {
				_, _ = Judge(j.api, j.ev.Name, j.ev.Data)
			}
		},
		"PickLeastRequests": func() { _ = PickLeastRequests(pool, maxRand) },
		"PickRoundRobin":    func() { _ = PickRoundRobin(pool, 7, maxRand) },
		"PickAffinity":      func() { _ = PickAffinity(pool, 42) },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocations", name, n)
		}
	}
}

// BenchmarkFollow reads a followed stream's events as a rescue does: a
// chat chunk (FollowChunk) and a Messages API text delta (FollowMessage).
func BenchmarkFollow(b *testing.B) {
	chunk := []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}`)
	name := []byte("content_block_delta")
	delta := []byte(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_, _, _ = FollowChunk(chunk)
		_ = FollowMessage(name, delta)
	}
}
