package policy

import (
	"time"

	"github.com/tidwall/gjson"
)

// Continuable says whether a chat completions request's stream, cut
// mid-answer, may be continued by sending its text so far as a trailing
// assistant message: "" when it may, else what stands in the way — n > 1
// (several answers interleaved), logprobs (a continuation's would not be
// the cut call's), or a JSON response_format (a schema or JSON mode: the
// constraint cannot be resumed mid-value).
func Continuable(body []byte) (why string) {
	doc := gjson.ParseBytes(body)
	switch {
	case doc.Get("n").Int() > 1:
		return "n"
	case doc.Get("logprobs").Bool() || doc.Get("top_logprobs").Int() > 0:
		return "logprobs"
	}
	switch doc.Get("response_format.type").String() {
	case "json_schema", "json_object":
		return "response_format"
	}
	return ""
}

// FollowChunk reads one chat.completion.chunk of a committed stream (one
// parse): its id, the text it adds to the answer (choice 0's content),
// and what in it, once
// streamed, rules a continuation out ("" for nothing): "tool_calls"
// (partial JSON arguments), "reasoning" (a continuation would think
// again), "refusal", "audio", or "finished" (a finish_reason: the answer
// is whole, nothing is left to continue).
func FollowChunk(data []byte) (id, text, blocker string) {
	chunk := gjson.ParseBytes(data)
	id = chunk.Get("id").Str
	for _, c := range chunk.Get("choices").Array() {
		d := c.Get("delta")
		if c.Get("index").Int() == 0 {
			text = d.Get("content").String()
		}
		switch {
		case len(d.Get("tool_calls").Array()) > 0 || present(d.Get("function_call")):
			blocker = "tool_calls"
		case d.Get("reasoning_content").String() != "" || d.Get("reasoning").String() != "":
			blocker = "reasoning"
		case d.Get("refusal").String() != "":
			blocker = "refusal"
		case present(d.Get("audio")):
			blocker = "audio"
		case c.Get("finish_reason").Type == gjson.String:
			blocker = "finished"
		}
		if blocker != "" {
			return id, text, blocker
		}
	}
	return id, text, ""
}

// present reports whether v is an object with something in it (servers
// send null or {} for a delta field they do not use).
func present(v gjson.Result) bool { return v.IsObject() && v.Raw != "{}" }

// What a Rescue's Blocker holds besides a streamed blocker (FollowChunk,
// Continuable): a bound the kept text met.
const (
	// RescueTooLarge: the text so far passed the route's
	// max_rescue_bytes, or a continuation's body would pass its max_body.
	RescueTooLarge = "too_large"
	// RescueBuffers: the proxy's buffer budget had no room for the text.
	RescueBuffers = "max_buffered_bytes"
)

// Rescue is where a committed stream, failed mid-answer, stands when
// Sturdy considers continuing it; Refusal decides, beside Retry.Decide.
type Rescue struct {
	// Blocker is what rules a continuation out: something streamed
	// (FollowChunk, Continuable) or a bound met (RescueTooLarge,
	// RescueBuffers); "" for nothing.
	Blocker string
	// HasTarget says a target from the current one on can continue.
	HasTarget bool
	// Tries is the continuations sent so far, MaxRescues the route's
	// max_rescues.
	Tries, MaxRescues int
	// Total is the attempts max_total_attempts counts so far, MaxTotal
	// that bound (Retry.TotalAttempts).
	Total, MaxTotal int
	// Remaining is the time left until the deadline; Elapsed the
	// request's age, MaxDuration the route's max_duration (0: none).
	Remaining, Elapsed, MaxDuration time.Duration
	// Interrupted: the stream was cut by Sturdy's shutdown or its client
	// left.
	Interrupted bool
	// BudgetSpent: the continuing upstream's retry budget had no retry
	// left. A continuation is a second request for one answer, paid for
	// like a retry (the caller reserves one before asking, and gives it
	// back unless Refusal is "" and the continuation is sent).
	BudgetSpent bool
}

// Refusal says why the stream is not continued now, as the rescues
// metric's result and the access log's rescue_refused, or "" when it is.
// The first that applies wins: a bound met, a blocker, no target, the
// request's limits used up, an interruption, then the budget.
func (r Rescue) Refusal() string {
	switch {
	case r.Blocker == RescueTooLarge || r.Blocker == RescueBuffers:
		return r.Blocker
	case r.Blocker != "":
		return "unsafe"
	case !r.HasTarget:
		return "no_target"
	case r.Tries >= r.MaxRescues || r.Total >= r.MaxTotal || r.Remaining <= 0,
		r.MaxDuration > 0 && r.Elapsed >= r.MaxDuration:
		return "exhausted"
	case r.Interrupted:
		return "interrupted"
	case r.BudgetSpent:
		return "budget"
	}
	return ""
}

// RescueNext is the target the next continuation goes to after one sent
// to target ti failed: the same target when the failure was retryable (a
// passing fault), else — it refused — the next one, from which the caller
// takes the first that can continue.
func RescueNext(ti int, retryable bool) int {
	if retryable {
		return ti
	}
	return ti + 1
}
