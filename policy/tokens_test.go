package policy

import (
	"math/rand/v2"
	"testing"
	"time"
)

// tokenStep is one operation on a budget at a time of the fake clock
// (from t0): reserve n (wanting ok, and wait when refused), settle a
// reservation of n to used, or refund n.
type tokenStep struct {
	at       time.Duration
	op       string // "reserve", "settle", "refund"
	n, used  int64
	ok       bool
	wait     time.Duration
	remains  int64 // the balance after the step
	hasState bool
}

func TestTheTokenWindowsArithmetic(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_800_000_000, 0) // on a slot's start
	s := time.Second
	for _, tt := range []struct {
		name  string
		limit int64
		steps []tokenStep
	}{
		{"reserves, then settles to the usage", 1000, []tokenStep{
			{op: "reserve", n: 600, ok: true, remains: 400, hasState: true},
			{at: s, op: "settle", n: 600, used: 200, remains: 800, hasState: true},
			{at: 2 * s, op: "reserve", n: 800, ok: true, remains: 0, hasState: true},
		}},
		{"concurrent reservations cannot overspend", 100, []tokenStep{
			{op: "reserve", n: 40, ok: true},
			{op: "reserve", n: 40, ok: true},
			{op: "reserve", n: 40, ok: false, wait: 0, remains: 20, hasState: true}, // held by the two in flight
		}},
		{"a refund gives it all back", 100, []tokenStep{
			{op: "reserve", n: 100, ok: true},
			{op: "reserve", n: 1, ok: false},
			{op: "refund", n: 100, remains: 100, hasState: true},
			{op: "reserve", n: 100, ok: true},
		}},
		{"a debt is carried until paid, a limit a minute: nothing is forgiven", 100, []tokenStep{
			{op: "reserve", n: 50, ok: true},
			{at: s, op: "settle", n: 50, used: 250, remains: -150, hasState: true},
			// Spent in the slot from 0 s: it leaves the window at 65 s, but
			// for the 150 past the limit, which stay another window.
			{at: 30 * s, op: "reserve", n: 1, ok: false, wait: 35 * s},
			{at: 64 * s, op: "reserve", n: 1, ok: false, wait: s},
			{at: 65 * s, op: "reserve", n: 1, ok: false, wait: 65 * s, remains: -50, hasState: true},
			{at: 130 * s, op: "reserve", n: 1, ok: true, remains: 49, hasState: true},
		}},
		{"a long quiet pays a limit a window", 100, []tokenStep{
			{op: "settle", used: 1000},
			// Four windows on: 900 past the limit, less three limits paid.
			{at: 300 * s, op: "reserve", n: 1, ok: false, wait: 65 * s, remains: -500, hasState: true},
			{at: 1000 * s, op: "reserve", n: 1, ok: true},
		}},
		{"spend leaves the window no sooner than 60 s after it", 100, []tokenStep{
			{at: 4 * s, op: "reserve", n: 100, ok: true},
			{at: 4 * s, op: "settle", n: 100, used: 100},
			{at: 63 * s, op: "reserve", n: 1, ok: false, wait: 2 * s}, // 59 s after: still in
			{at: 65 * s, op: "reserve", n: 1, ok: true},
		}},
		{"the oldest spend leaves first", 100, []tokenStep{
			{op: "settle", used: 60},
			{at: 20 * s, op: "settle", used: 40},
			{at: 30 * s, op: "reserve", n: 50, ok: false, wait: 35 * s},  // the first 60 must go
			{at: 30 * s, op: "reserve", n: 100, ok: false, wait: 55 * s}, // both
		}},
		{"more than the whole budget: admitted when the balance is full", 100, []tokenStep{
			{op: "reserve", n: 500, ok: true, remains: -400, hasState: true},
			{at: s, op: "settle", n: 500, used: 450},
			{at: 10 * s, op: "reserve", n: 500, ok: false, wait: 55 * s},
			{at: 65 * s, op: "reserve", n: 500, ok: false, wait: 65 * s}, // 350 past the limit carried
			{at: 260 * s, op: "reserve", n: 500, ok: false, wait: 65 * s},
			{at: 325 * s, op: "reserve", n: 500, ok: true}, // 450 paid at 100 a minute
		}},
		{"more than the whole budget: not while anything is held", 100, []tokenStep{
			{op: "reserve", n: 10, ok: true},
			{op: "reserve", n: 500, ok: false, wait: 0},
		}},
		{"no limit: every reservation", 0, []tokenStep{
			{op: "reserve", n: 1 << 40, ok: true},
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var w TokenWindow
			w.SetLimit(tt.limit)
			for i, st := range tt.steps {
				now := t0.Add(st.at)
				switch st.op {
				case "reserve":
					ok, wait := w.Reserve(st.n, now)
					if ok != st.ok || (!ok && wait != st.wait) {
						t.Fatalf("step %d: reserve %d at %v: %v, wait %v; want %v, wait %v", i, st.n, st.at, ok, wait, st.ok, st.wait)
					}
				case "settle":
					w.Settle(st.n, st.used, now)
				case "refund":
					w.Refund(st.n)
				}
				if got := w.State(now).Remaining; st.hasState && got != st.remains {
					t.Fatalf("step %d: %d remaining, want %d", i, got, st.remains)
				}
			}
		})
	}
}

func TestATokenBudgetInDebtIsNeverIdle(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_800_000_000, 0)
	var w TokenWindow
	w.SetLimit(100)
	if !w.Idle(t0) {
		t.Fatal("a new budget is not idle")
	}
	w.Reserve(10, t0)
	if w.Idle(t0) {
		t.Fatal("idle with a reservation in flight")
	}
	w.Settle(10, 300, t0)
	if st := w.State(t0.Add(time.Second)); st.Reset != 64*time.Second || st.Remaining != -200 {
		t.Fatalf("state %+v: want a reset in 64 s and 200 in debt", st)
	}
	// 200 past the limit are carried: paid at 100 a window, by 195 s.
	if w.Idle(t0.Add(30*time.Second)) || w.Idle(t0.Add(65*time.Second)) || w.Idle(t0.Add(130*time.Second)) || !w.Idle(t0.Add(195*time.Second)) {
		t.Fatal("idle in debt, or not once the debt was paid")
	}
	var v TokenWindow
	v.SetLimit(100)
	v.Settle(0, 300, t0)
	v.SetLimit(1000) // a reload keeps the spend
	if st := v.State(t0.Add(time.Second)); st.Remaining != 700 {
		t.Fatalf("after a new limit %d remaining, want 700", st.Remaining)
	}
}

func TestEstimateTokens(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		chars       int
		max, limit  int64
		want        int64
		description string
	}{
		{400, 0, 100_000, 100 + 1024, "no max_tokens: 1,024"},
		{401, 0, 100_000, 101 + 1024, "characters ÷ 4, rounded up"},
		{400, 50, 100_000, 150, "max_tokens when given"},
		{400, 0, 100, 100 + 25, "no max_tokens, a small budget: a quarter of it"},
		{0, 0, 0, 0, "nothing"},
		{4, 1<<63 - 1, 0, 1 + 1<<40, "a max_tokens near 2⁶³, no limit: bounded, never wrapping to a free reservation"},
		{4, 1<<63 - 1, 100, 1 + 25, "a max_tokens near 2⁶³ under a limit: a quarter of it"},
		{400, 1e12, 10_000, 100 + 2_500, "a max_tokens past a quarter of the limit: a quarter of it"},
		{400, 2_000, 10_000, 100 + 2_000, "a max_tokens within a quarter of the limit: itself"},
	} {
		if got := EstimateTokens(tt.chars, tt.max, tt.limit); got != tt.want {
			t.Errorf("%s: EstimateTokens(%d, %d, %d) = %d, want %d", tt.description, tt.chars, tt.max, tt.limit, got, tt.want)
		}
	}
}

func TestReservation(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ n, limit, want int64 }{
		{10, 0, 10}, {10, 100, 10}, {50, 100, 50}, {51, 100, 50}, {1 << 40, 100, 50}, {5, 1, 1},
	} {
		if got := Reservation(tt.n, tt.limit); got != tt.want {
			t.Errorf("Reservation(%d, %d) = %d, want %d", tt.n, tt.limit, got, tt.want)
		}
	}
}

// TestNoMinuteHoldsMoreThanATokenBudget drives a budget with random
// requests (each using at most what it reserved, settled 0–20 s after
// it) for 10 simulated minutes, and checks every 60 s window of what was
// settled holds no more than the limit.
func TestNoMinuteHoldsMoreThanATokenBudget(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(5, 6))
	const limit = 10_000
	t0 := time.Unix(1_800_000_000, 0)
	var w TokenWindow
	w.SetLimit(limit)
	type open struct {
		at       time.Duration
		reserved int64
	}
	var inFlight []open
	var spent []open // settled: when, how much
	for now := time.Duration(0); now < 10*time.Minute; now += 100 * time.Millisecond {
		if n := int64(1 + r.IntN(2000)); r.IntN(2) == 0 {
			if ok, _ := w.Reserve(n, t0.Add(now)); ok {
				inFlight = append(inFlight, open{now + time.Duration(r.IntN(20_000))*time.Millisecond, n})
			}
		}
		kept := inFlight[:0]
		for _, o := range inFlight {
			if o.at > now {
				kept = append(kept, o)
				continue
			}
			used := o.reserved // most use all they reserved, some less
			if r.IntN(4) == 0 {
				used = r.Int64N(o.reserved + 1)
			}
			w.Settle(o.reserved, used, t0.Add(now))
			spent = append(spent, open{now, used})
		}
		inFlight = kept
	}
	for i, a := range spent {
		var sum int64
		for _, b := range spent[i:] {
			if b.at-a.at < time.Minute {
				sum += b.reserved
			}
		}
		if sum > limit {
			t.Fatalf("%d tokens settled in the minute from %v: over the limit %d", sum, a.at, limit)
		}
	}
}

// BenchmarkTokenWindow is a request's way through a budget: reserve,
// then settle. 0 allocations.
func BenchmarkTokenWindow(b *testing.B) {
	var w TokenWindow
	w.SetLimit(1 << 40)
	now := time.Unix(1_800_000_000, 0)
	b.ReportAllocs()
	for b.Loop() {
		if ok, _ := w.Reserve(1500, now); !ok {
			b.Fatal("refused")
		}
		w.Settle(1500, 1200, now)
	}
}

func TestRequestTokens(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		api   API
		body  string
		chars int
		max   int64
	}{
		{"chat, string contents: their bytes", APIChat, `{"model":"m","messages":[{"role":"system","content":"abcd"},{"role":"user","content":"héllo"}],"max_tokens":50}`, 10, 50},
		{"chat, tools: their JSON's bytes", APIChat, `{"messages":[{"role":"user","content":"ab"}],"tools":[{"type":"function"}]}`, 2 + len(`[{"type":"function"}]`), 0},
		{"anthropic, tools", APIAnthropic, `{"tools":[{"name":"x"}],"messages":[]}`, len(`[{"name":"x"}]`), 0},
		{"a CJK prompt: three bytes a character", APICompletions, `{"prompt":"日本語"}`, 9, 0},
		{"chat, parts; max_completion_tokens first", APIChat, `{"messages":[{"role":"user","content":[{"type":"text","text":"abc"},{"type":"image_url","image_url":{"url":"x"}}]}],"max_tokens":9,"max_completion_tokens":70}`, 3, 70},
		{"completions, a prompt list", APICompletions, `{"prompt":["ab","cd"]}`, 4, 0},
		{"responses, instructions and input items", APIResponses, `{"instructions":"be","input":[{"role":"user","content":[{"type":"input_text","text":"abc"}]}],"max_output_tokens":30}`, 5, 30},
		{"responses, a string input", APIResponses, `{"input":"abcdef"}`, 6, 0},
		{"anthropic, system blocks and messages", APIAnthropic, `{"system":[{"type":"text","text":"sys"}],"messages":[{"role":"user","content":"hi"}],"max_tokens":1024}`, 5, 1024},
		{"ollama, generate", APIOllama, `{"system":"s","prompt":"abc","options":{"num_predict":12}}`, 4, 12},
		{"embeddings", APIOther, `{"input":["abc","de"]}`, 5, 0},
		{"not JSON", APIChat, `{"messages":`, 0, 0},
		{"a negative max_tokens is none", APIChat, `{"messages":[],"max_tokens":-5}`, 0, 0},
	} {
		if chars, max := RequestTokens(tt.api, []byte(tt.body)); chars != tt.chars || max != tt.max {
			t.Errorf("%s: %d bytes, max %d; want %d, %d", tt.name, chars, max, tt.chars, tt.max)
		}
	}
}

// TestATokenWindowTakesAnyTime: times before 1970, or a clock stepped
// back, neither panic nor let spend leave the window early.
func TestATokenWindowTakesAnyTime(t *testing.T) {
	t.Parallel()
	var w TokenWindow
	w.SetLimit(100)
	for _, now := range []time.Time{{}, time.Unix(10, 0), time.Unix(-1_000_000, 0)} {
		if ok, _ := w.Reserve(10, now); !ok {
			t.Fatalf("refused at %v", now)
		}
		w.Settle(10, 10, now)
		w.State(now)
		w.Idle(now)
	}
	var v TokenWindow
	v.SetLimit(100)
	t0 := time.Unix(1_800_000_000, 0)
	v.Settle(0, 60, t0.Add(65*time.Second)) // 13 slots on: the same place in the ring
	v.Settle(0, 40, t0)                     // older than the slot kept in its place: added to it, not over it
	if st := v.State(t0.Add(65 * time.Second)); st.Remaining != 0 {
		t.Fatalf("%d remaining, want 0: a settlement with an older time wiped a newer one", st.Remaining)
	}
	if ok, _ := v.Reserve(1<<62, t0.Add(200*time.Second)); !ok {
		t.Fatal("a huge reservation on a full balance was refused")
	}
	if st := v.State(t0.Add(200 * time.Second)); st.Remaining >= 0 {
		t.Fatalf("%d remaining after a huge reservation, want a debt (it must not wrap)", st.Remaining)
	}
}

// TestOverspendIsPaidBack: clients that reserve 1,024 tokens (no
// max_tokens) and use 4,000, as many at once as a 10,000-token budget
// admits, spend over ten minutes about what ten minutes allow: the debt
// a burst leaves blocks the minutes after it. Before, it aged out with
// its own window: 36,900 settled in one minute (3.7×), 2.0× sustained.
func TestOverspendIsPaidBack(t *testing.T) {
	t.Parallel()
	const limit, reserve, used = 10_000, 1_024, 4_000
	var w TokenWindow
	w.SetLimit(limit)
	t0 := time.Unix(1_800_000_000, 0)
	type hold struct{ end time.Time }
	var inFlight []hold
	settled := int64(0)
	for now := t0; now.Before(t0.Add(10 * time.Minute)); now = now.Add(100 * time.Millisecond) {
		kept := inFlight[:0]
		for _, h := range inFlight {
			if now.Before(h.end) {
				kept = append(kept, h)
				continue
			}
			w.Settle(reserve, used, now)
			settled += used
		}
		inFlight = kept
		for len(inFlight) < 16 { // agents sending as fast as they are admitted
			if ok, _ := w.Reserve(reserve, now); !ok {
				break
			}
			inFlight = append(inFlight, hold{end: now.Add(10 * time.Second)})
		}
	}
	if ratio := float64(settled) / (10 * limit); ratio > 1.1 {
		t.Fatalf("settled %d in 10 minutes against %d a minute: %.2f× the budget", settled, limit, ratio)
	} else {
		t.Logf("settled %.2f× the budget over 10 minutes", ratio)
	}
}
