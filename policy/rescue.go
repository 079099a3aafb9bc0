package policy

import (
	"strings"
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
// parse, in place: id and text point into data, to be copied if they
// outlive it): its id, the text it adds to the answer (choice 0's content),
// and what in it, once
// streamed, rules a continuation out ("" for nothing): "tool_calls"
// (partial JSON arguments), "reasoning" (a continuation would think
// again), "refusal", "audio", or "finished" (a finish_reason: the answer
// is whole, nothing is left to continue).
func FollowChunk(data []byte) (id, text, blocker string) {
	chunk := inPlace(data)
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

// ContinuableMessages is Continuable for a Messages API request: "" when
// its stream, cut mid-answer, may be continued by prefill (the text so
// far as the trailing assistant message), else what stands in the way —
// "thinking" (extended thinking: its signed blocks cannot be prefilled,
// and Anthropic refuses a prefill with thinking on), "response_format"
// (a JSON output format: the constraint cannot be resumed mid-value) or
// "prefill" (the request ends with an assistant message the text cannot
// be added to: its content neither a string nor ending in a text block).
func ContinuableMessages(body []byte) (why string) {
	doc := gjson.ParseBytes(body)
	last := doc.Get("messages.@reverse.0")
	switch t := doc.Get("thinking.type").String(); {
	case t != "" && t != "disabled":
		return "thinking"
	case doc.Get("output_format.type").String() == "json_schema", doc.Get("output_config.format.type").String() == "json_schema":
		return "response_format"
	case last.Get("role").String() == "assistant" && last.Get("content").Type != gjson.String &&
		last.Get("content.@reverse.0.type").String() != "text":
		return "prefill"
	}
	return ""
}

// MessageEvent is what one event of a committed Messages API stream
// tells a rescue (FollowMessage).
type MessageEvent struct {
	// Type is the event's type (message_start, content_block_delta …).
	Type string
	// Index is a content block event's block index; Block a
	// content_block_start's block type (text, tool_use, thinking …).
	Index int64
	Block string
	// Text is the answer's text the event adds: a text_delta's, or a
	// text block start's own.
	Text string
	// OutputTokens is the usage.output_tokens it reports (message_start's
	// message.usage, message_delta's usage: cumulative), -1 for none.
	OutputTokens int64
	// Blocker is what in it, once streamed, rules a continuation out ("":
	// nothing): "tool_use" (a tool's or server tool's block: partial JSON,
	// a call under way), "thinking" (a thinking or redacted_thinking
	// block), "citations" (a citation is tied to its text block),
	// "finished" (a stop_reason: the answer is whole), or "unknown" (a
	// block or delta type this version does not know).
	Blocker string
}

// FollowMessage reads one event of a committed Messages API stream (one
// parse, in place: its strings point into name and data, to be copied if
// they outlive them): name is its SSE event name (its data's "type" when
// empty).
func FollowMessage(name, data []byte) MessageEvent {
	doc := inPlace(data)
	m := MessageEvent{Type: eventType(name, doc), Index: -1, OutputTokens: -1}
	if i := doc.Get("index"); i.Exists() {
		m.Index = i.Int()
	}
	switch m.Type {
	case "message_start":
		m.OutputTokens = tokens(doc.Get("message.usage.output_tokens"))
	case "message_delta":
		m.OutputTokens = tokens(doc.Get("usage.output_tokens"))
		if sr := doc.Get("delta.stop_reason"); sr.Exists() && sr.Type != gjson.Null {
			m.Blocker = "finished"
		}
	case "content_block_start":
		b := doc.Get("content_block")
		m.Block = b.Get("type").String()
		m.Blocker = blockBlocker(m.Block)
		if m.Block == "text" {
			m.Text = b.Get("text").String()
		}
	case "content_block_delta":
		d := doc.Get("delta")
		switch t := d.Get("type").String(); t {
		case "text_delta":
			m.Text = d.Get("text").String()
		case "citations_delta":
			m.Blocker = "citations"
		case "input_json_delta":
			m.Blocker = "tool_use"
		case "thinking_delta", "signature_delta":
			m.Blocker = "thinking"
		default:
			m.Blocker = "unknown"
		}
	}
	return m
}

// blockBlocker is what a content block of type t rules out ("" for a text
// block).
func blockBlocker(t string) string {
	switch {
	case t == "text":
		return ""
	case t == "thinking" || t == "redacted_thinking":
		return "thinking"
	case t == "tool_use" || strings.HasSuffix(t, "tool_use") || strings.HasSuffix(t, "tool_result"):
		return "tool_use"
	}
	return "unknown"
}

// tokens is a usage count, -1 when it is not there.
func tokens(v gjson.Result) int64 {
	if v.Type != gjson.Number {
		return -1
	}
	return v.Int()
}
