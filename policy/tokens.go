package policy

import (
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/tidwall/gjson"
)

// A token budget's window: tokens count for a minute, in slots of
// tokenSlot, so that what was spent leaves the window between 60 and 65 s
// after it was spent — never sooner, so no 60 s window ever holds more
// than the limit (a bucket holding a minute of burst would admit up to
// twice the limit in some 60 s window).
const (
	tokenSlot   = 5 * time.Second
	tokenSlots  = 13 // 12 whole slots (60 s) and the current one
	tokenWindow = tokenSlots * tokenSlot
)

// TokenWindow is a token budget of Limit tokens a minute (a
// tokens_per_minute): reserved once, at admission, from an estimate
// (EstimateTokens), then settled to what the reply used, or refunded when
// the attempt failed before any output. Reserving before sending is what
// keeps concurrent requests under the limit (counting after the fact let
// 5 concurrent requests spend 663 tokens of a 100-token minute: LiteLLM
// #18730).
//
// The balance — the limit less what the window holds and what is
// reserved — may go negative when replies used more than their
// estimates: a debt. It is carried until paid, a limit a minute: as
// spend leaves the window, what the window held past the limit stays in
// it (advance), so what a minute overspent blocks the minutes after it,
// not only its own. Nothing is forgiven. A reservation larger than the
// whole limit is admitted when the balance is full (a small budget stays
// usable), and then is a debt like any other.
//
// TokenWindow keeps state but does no I/O and reads no clock: callers
// pass the time. It is safe for concurrent use; its zero value has no
// limit (every Reserve succeeds) until SetLimit.
type TokenWindow struct {
	mu       sync.Mutex
	limit    int64
	reserved int64
	slots    [tokenSlots]tokenSpend
	// seen is the last slot advance brought the window to.
	seen int64
}

// advance brings the window to slot now: each slot that left the window
// since seen leaves only what the window then held within the limit; the
// rest, a debt, is carried into the slot that takes its place in the
// ring, as if spent then. A long quiet pays a limit a window at once.
// Under mu.
func (w *TokenWindow) advance(now int64) {
	switch {
	case now <= w.seen:
		return // the same slot, or a clock stepped back
	case w.seen == 0 || w.limit <= 0:
		w.seen = now
		return
	case now-w.seen > 2*tokenSlots:
		owed := w.spentAt(w.seen) - w.limit
		owed -= (now-w.seen)/tokenSlots*w.limit - w.limit // the first window frees the limit's worth as ever
		w.slots, w.seen = [tokenSlots]tokenSpend{}, now
		if owed > 0 {
			w.slots[at(now)] = tokenSpend{slot: now, spent: owed}
		}
		return
	}
	for s := w.seen + 1; s <= now; s++ {
		e := &w.slots[at(s)] // the slot leaving the window at s, whose place s takes
		if e.slot != s-tokenSlots || e.spent == 0 {
			continue
		}
		carry := min(e.spent, w.spentAt(s-1)-w.limit)
		*e = tokenSpend{slot: s, spent: max(carry, 0)}
	}
	w.seen = now
}

// slotOf is the slot now falls in, and at is where slot s is kept in the
// ring (never negative: a time before 1970 is a time too).
func slotOf(now time.Time) int64 { return floorDiv(now.UnixNano(), int64(tokenSlot)) }

func at(s int64) int64 { return (s%tokenSlots + tokenSlots) % tokenSlots }

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// tokenSpend is what was settled in one slot of the window.
type tokenSpend struct {
	slot  int64 // the slot's number: the time ÷ tokenSlot
	spent int64
}

// SetLimit sets the tokens a minute (0: none); what the window holds and
// what is reserved are kept, so a reload does not reset a budget.
func (w *TokenWindow) SetLimit(limit int64) {
	w.mu.Lock()
	w.limit = min(max(limit, 0), maxTokens)
	w.mu.Unlock()
}

// spentAt is what the window holds at now; under mu.
func (w *TokenWindow) spentAt(now int64) int64 {
	var sum int64
	for _, s := range w.slots {
		if now-s.slot < tokenSlots {
			sum += s.spent
		}
	}
	return sum
}

// Reserve takes n tokens from the budget if it allows them at now, and
// reports whether it did; if not, wait is how long until it would (0
// when reservations in flight hold the budget: they settle when their
// replies end, which the budget cannot foresee — the caller waits at
// least a slot). The caller Settles or Refunds exactly what it reserved.
func (w *TokenWindow) Reserve(n int64, now time.Time) (ok bool, wait time.Duration) {
	n = min(max(n, 0), maxTokens)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.limit <= 0 {
		w.reserved = min(w.reserved+n, maxTokens)
		return true, 0
	}
	slot := slotOf(now)
	w.advance(slot)
	spent := w.spentAt(slot)
	// held is what must leave the window before n fits: for a reservation
	// larger than the limit, everything.
	held := spent + w.reserved + n - w.limit
	if n > w.limit {
		held = spent + w.reserved
	}
	if held <= 0 {
		w.reserved = min(w.reserved+n, maxTokens)
		return true, 0
	}
	if held > spent { // the reservations in flight are in the way
		return false, 0
	}
	return false, w.agedOut(held, slot, now)
}

// agedOut is how long from now until at least need of what the window
// holds has left it (slot: now's); under mu.
func (w *TokenWindow) agedOut(need, slot int64, now time.Time) time.Duration {
	var freed int64
	for age := int64(tokenSlots - 1); age >= 0; age-- { // the oldest slot first
		s := w.slots[at(slot-age)]
		if s.slot != slot-age {
			continue
		}
		if freed += s.spent; freed >= need {
			return time.Duration((s.slot+tokenSlots)*int64(tokenSlot) - now.UnixNano())
		}
	}
	return tokenWindow
}

// Settle turns a reservation of reserved tokens into used, spent at now:
// the reply's usage as it ended.
func (w *TokenWindow) Settle(reserved, used int64, now time.Time) {
	slot := slotOf(now)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.advance(slot)
	w.reserved = max(w.reserved-max(reserved, 0), 0)
	s := &w.slots[at(slot)]
	if s.slot < slot {
		*s = tokenSpend{slot: slot}
	} // a time older than the slot kept there (a clock stepped back) adds to the newer one: it stays longer, never less
	s.spent = min(s.spent+max(used, 0), maxTokens)
}

// Refund gives back a reservation whose attempt used nothing (it failed
// before any output, or another target took the request).
func (w *TokenWindow) Refund(reserved int64) {
	w.mu.Lock()
	w.reserved = max(w.reserved-max(reserved, 0), 0)
	w.mu.Unlock()
}

// TokenState is a budget as the x-ratelimit-*-tokens headers tell it:
// the limit, what remains of it (negative: a debt) and how long until
// the window holds nothing it holds now.
type TokenState struct {
	Limit, Remaining, Reserved int64
	Reset                      time.Duration
}

// State is the budget at now.
func (w *TokenWindow) State(now time.Time) TokenState {
	slot := slotOf(now)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.advance(slot)
	spent := w.spentAt(slot)
	st := TokenState{Limit: w.limit, Remaining: w.limit - spent - w.reserved, Reserved: w.reserved}
	if spent > 0 {
		st.Reset = w.agedOut(spent, slot, now)
	}
	return st
}

// Idle reports whether the budget holds nothing at now — no reservation
// in flight, nothing spent in the window — so a bounded map of budgets
// may drop it; one in debt is never idle.
func (w *TokenWindow) Idle(now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.advance(slotOf(now))
	return w.reserved == 0 && w.spentAt(slotOf(now)) == 0
}

// DefaultOutputEstimate is a reservation's output tokens when the request
// names no max_tokens (max_completion_tokens, max_output_tokens): at
// most this, at most a quarter of the limit.
const DefaultOutputEstimate = 1024

// EstimateTokens is what a request reserves of a budget of limit tokens
// a minute (0: no limit). Its input is its text's bytes ÷ 4, rounded up
// (TextBytes). Its output is maxOutput when set (> 0), else DefaultOutputEstimate;
// under a limit, at most a quarter of it.
// A reply that uses more is charged in full when it settles: a client's
// max_tokens cannot make one request hold a window others need.
func EstimateTokens(textBytes int, maxOutput, limit int64) int64 {
	in := (int64(max(textBytes, 0)) + 3) / 4
	out := min(maxOutput, maxTokens)
	if maxOutput <= 0 {
		out = DefaultOutputEstimate
		if limit <= 0 {
			out = 0
		}
	}
	if limit > 0 {
		out = min(out, limit/4)
	}
	return in + out
}

// Reservation bounds what one request reserves of a window of limit
// tokens (0: no limit) to half of it. The rest of what it uses is charged
// when it settles.
func Reservation(n, limit int64) int64 {
	if limit <= 0 {
		return n
	}
	return min(n, max(limit/2, 1))
}

// maxTokens bounds every count a budget keeps (2⁴⁰, a trillion tokens):
// a client's max_tokens of 2⁶³−1 cannot wrap a sum into a negative, free
// reservation.
const maxTokens = 1 << 40

// requestText is where each API's request carries its text (its prompt):
// the paths whose text EstimateTokens counts.
var requestText = map[API][]string{
	APIChat:        {"messages"},
	APICompletions: {"prompt"},
	APIResponses:   {"instructions", "input"},
	APIAnthropic:   {"system", "messages"},
	APIOllama:      {"system", "prompt", "messages"},
	APIOther:       {"input"}, // embeddings
}

// requestTools are the keys whose whole value a model reads as prompt:
// tool and function definitions, counted by their JSON's bytes.
var requestTools = []string{"tools", "functions"}

// RequestTokens reads what a request body reserves by (EstimateTokens):
// its text's bytes — the messages' contents (strings, or the text of
// their parts), a prompt, an input, a system prompt, as the API (api)
// carries them, and its tool definitions whole — and the output tokens it
// asks at most (max_tokens, max_completion_tokens, max_output_tokens,
// Ollama's options.num_predict; 0: none given).
func RequestTokens(api API, body []byte) (textBytes int, maxTokens int64) {
	// One pass over the top-level keys, the text read as it is skipped:
	// a gjson Get (or ForEach) would skip it byte by byte for each key.
	texts := requestText[api]
	var outs [len(maxOutputKeys)]int64
	raw := unsafe.String(unsafe.SliceData(body), len(body))
	Fields(raw, func(key string, i int) int {
		if slices.Contains(texts, key) {
			n, end := textValue(raw, i)
			textBytes += n
			return end
		}
		end := valueEnd(raw, i)
		if slices.Contains(requestTools, key) {
			textBytes += end - i
			return end
		}
		for k, name := range maxOutputKeys {
			if key != name {
				continue
			}
			v := gjson.Parse(raw[i:end])
			if name == "options" { // Ollama's options.num_predict
				v = v.Get("num_predict")
			}
			if v.Type == gjson.Number && v.Int() > 0 && outs[k] == 0 {
				outs[k] = v.Int()
			}
		}
		return end
	})
	for _, n := range outs { // the first key listed that is set wins
		if n > 0 {
			return textBytes, n
		}
	}
	return textBytes, 0
}

// maxOutputKeys are where a request says the output tokens it asks at most,
// the first that is set winning; the last is Ollama's options.num_predict.
var maxOutputKeys = [...]string{"max_completion_tokens", "max_tokens", "max_output_tokens", "options"}
