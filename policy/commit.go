package policy

import (
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
)

// Mark is what one stream event, before the commit point, means.
type Mark uint8

// The marks of an event.
const (
	// MarkFraming: the stream is starting (a role-only chunk, response.created …).
	MarkFraming Mark = iota
	// MarkContent: the model's output has begun: commit.
	MarkContent
	// MarkFailure: the upstream failed before any output (see EventFailure).
	MarkFailure
)

// Judge says what an event before the commit point means for api: output
// (commit), framing (hold it and read on) or a failure. On a failure it
// also returns the error's code (or type) as the upstream wrote it, for
// EventFailure and the access log.
//
// The event is its name (SSE "event:", empty for NDJSON and unnamed
// events) and its data (the JSON value), as events.Next reads them. It
// reads them in place and allocates nothing but the code of a failure.
func Judge(api API, name, data []byte) (mark Mark, code string) {
	// Read in place: no result outlives this call but the cloned code.
	doc := inPlace(data)
	switch api {
	case APIChat, APICompletions:
		return chatMark(api, &doc)
	case APIResponses:
		return responsesMark(name, &doc)
	case APIAnthropic:
		return anthropicMark(name, &doc)
	case APIOllama:
		return ollamaMark(&doc)
	}
	return MarkContent, ""
}

// chatMark judges a chat (or legacy completions) chunk.
func chatMark(api API, doc *gjson.Result) (Mark, string) {
	// One pass over the top-level keys (each Get would scan from the
	// start); the first of each key counts, as Get finds it.
	// A value ForEach gives always Exists: that tells a key seen.
	var e, usage, choices gjson.Result
	doc.ForEach(func(k, v gjson.Result) bool {
		switch {
		case k.Str == "error" && !e.Exists():
			e = v
		case k.Str == "usage" && !usage.Exists():
			usage = v
		case k.Str == "choices" && !choices.Exists():
			choices = v
		}
		return !e.Exists() || !usage.Exists() || !choices.Exists()
	})
	if e.Exists() {
		return MarkFailure, strings.Clone(errorCode(e))
	}
	return chunkMark(api, &usage, &choices), ""
}

// ollamaMark judges an Ollama line.
func ollamaMark(doc *gjson.Result) (Mark, string) {
	if e := doc.Get("error"); e.Exists() {
		return MarkFailure, strings.Clone(e.String())
	}
	if doc.Get("done").Bool() || doc.Get("message.content").String() != "" || doc.Get("response").String() != "" ||
		doc.Get("message.tool_calls").Exists() || doc.Get("message.thinking").String() != "" {
		return MarkContent, ""
	}
	return MarkFraming, ""
}

// inPlace parses the JSON in b without copying it: every string of the
// result points into b, valid as long as b is and unchanged.
func inPlace(b []byte) gjson.Result { return gjson.Parse(unsafe.String(unsafe.SliceData(b), len(b))) }

// eventType is an event's type: its SSE name, else its data's "type"
// (read in place).
func eventType(name []byte, doc gjson.Result) string {
	if len(name) > 0 {
		return unsafe.String(unsafe.SliceData(name), len(name))
	}
	return doc.Get("type").String()
}

// responsesMark judges a Responses API event before the commit point:
// the stream's framing (created, in progress, queued, an empty item or
// part announced), a failure (error, response.failed) or output.
func responsesMark(name []byte, doc *gjson.Result) (Mark, string) {
	typ := eventType(name, *doc)
	switch typ {
	case "response.created", "response.in_progress", "response.queued", "":
		return MarkFraming, ""
	case "error":
		return MarkFailure, strings.Clone(errorCode(*doc))
	case "response.failed":
		return MarkFailure, strings.Clone(errorCode(doc.Get("response.error")))
	case "response.output_item.added":
		// An empty message or reasoning item announced holds no output
		// yet (a function call's announcement names the tool: output).
		item := doc.Get("item")
		if t := item.Get("type").String(); (t == "message" && isEmpty(item.Get("content"))) ||
			(t == "reasoning" && isEmpty(item.Get("summary")) && isEmpty(item.Get("content"))) {
			return MarkFraming, ""
		}
	case "response.content_part.added":
		if p := doc.Get("part"); p.Get("text").String() == "" && p.Get("refusal").String() == "" {
			return MarkFraming, ""
		}
	}
	return MarkContent, ""
}

// anthropicMark judges a Messages API event before the commit point.
// Output has begun at the first content_block_delta, at a
// content_block_start that carries content itself (a tool_use's name and
// id, redacted_thinking, a server tool's result: they have no deltas), or
// at a message_delta with a stop_reason (an empty answer); message_start,
// ping, an empty text or thinking block's start and its stop are framing;
// an error event is a failure, its code the error's type
// (overloaded_error, api_error, rate_limit_error …).
func anthropicMark(name []byte, doc *gjson.Result) (Mark, string) {
	typ := eventType(name, *doc)
	switch typ {
	case "message_start", "ping", "content_block_stop":
		return MarkFraming, ""
	case "error":
		return MarkFailure, strings.Clone(doc.Get("error.type").String())
	case "content_block_start":
		b := doc.Get("content_block")
		switch b.Get("type").String() {
		case "text":
			if b.Get("text").String() == "" {
				return MarkFraming, ""
			}
		case "thinking":
			if b.Get("thinking").String() == "" {
				return MarkFraming, ""
			}
		}
	case "message_delta":
		if sr := doc.Get("delta.stop_reason"); !sr.Exists() || sr.Type == gjson.Null {
			return MarkFraming, ""
		}
	}
	return MarkContent, ""
}

// isEmpty says whether a JSON array is absent, null or has no element
// (read without allocating, as Judge must).
func isEmpty(a gjson.Result) bool {
	if !a.Exists() || a.Type == gjson.Null {
		return true
	}
	empty := a.IsArray()
	a.ForEach(func(_, _ gjson.Result) bool { empty = false; return false })
	return empty
}

// chunkMark finds output in a chat (or legacy completions) chunk, given
// its usage and choices.
func chunkMark(api API, usage, choices *gjson.Result) Mark {
	if usage.Exists() && usage.Type != gjson.Null {
		return MarkContent
	}
	if !choices.IsArray() { // a lone choice, as gjson's Array would read it
		if choices.Exists() && choices.Type != gjson.Null && choiceHasOutput(api, choices) {
			return MarkContent
		}
		return MarkFraming
	}
	mark := MarkFraming
	choices.ForEach(func(_, c gjson.Result) bool {
		if choiceHasOutput(api, &c) {
			mark = MarkContent
			return false
		}
		return true
	})
	return mark
}

// choiceHasOutput reports whether one choice of a chunk carries output:
// a finish_reason, text, a tool call, a legacy function call or audio.
// Each key is read by a helper (setNonNull, nonEmpty, nonEmptyArray,
// nonEmptyObject) with gjson.Get on the raw JSON: the results are not on
// this frame, and a Get goes less deep than a ForEach over the choice,
// which parses every value (a number's parse alone takes a KiB) — a
// judged stream's first event is read at the attempt loop's deepest, or
// a continuation's, under 8 KiB of stack.
func choiceHasOutput(api API, c *gjson.Result) bool {
	if setNonNull(c.Raw, "finish_reason") {
		return true
	}
	if api == APICompletions {
		return nonEmpty(c.Raw, "text")
	}
	d := rawOf(c.Raw, "delta")
	for _, k := range outputKeys {
		if nonEmpty(d, k) {
			return true
		}
	}
	// a tool call; legacy function calling; audio output
	return nonEmptyArray(d, "tool_calls") || nonEmptyObject(d, "function_call") || nonEmptyObject(d, "audio")
}

// outputKeys are the delta keys whose non-empty string is output.
var outputKeys = [...]string{"content", "refusal", "reasoning_content", "reasoning"}

// setNonNull reports whether raw's key is there and not null.
func setNonNull(raw, key string) bool {
	v := gjson.Get(raw, key)
	return v.Exists() && v.Type != gjson.Null
}

// nonEmpty reports whether raw's key reads as a non-empty string.
func nonEmpty(raw, key string) bool { return gjson.Get(raw, key).String() != "" }

// rawOf is raw's key as JSON ("": none).
func rawOf(raw, key string) string { return gjson.Get(raw, key).Raw }

// nonEmptyArray reports whether raw's key is an array with an element.
func nonEmptyArray(raw, key string) bool {
	v := gjson.Get(raw, key)
	has := false
	if v.IsArray() {
		v.ForEach(func(_, _ gjson.Result) bool { has = true; return false })
	}
	return has
}

// nonEmptyObject reports whether raw's key is an object other than {}.
func nonEmptyObject(raw, key string) bool {
	v := gjson.Get(raw, key)
	return v.IsObject() && v.Raw != "{}"
}

// errorCode is an error object's code when EventFailure knows it, else
// its type when that is known (an "invalid_request_error" of any code is
// the client's), else the code, else the type.
func errorCode(e gjson.Result) string {
	code, typ := e.Get("code").String(), e.Get("type").String()
	switch {
	case code != "" && knownEvent(code):
		return code
	case typ != "" && knownEvent(typ):
		return typ
	case code != "":
		return code
	}
	return typ
}

// knownEvent reports whether EventFailure names code: a rate limit or the
// client's own mistake.
func knownEvent(code string) bool {
	_, ok := eventClass[code]
	return ok
}

// eventClass holds the in-band error codes (and types) that are not a
// server failure: rate limits, and the client's own mistakes (its
// request, its key, its quota, its images).
var eventClass = map[string]Class{
	"rate_limit_exceeded": ClassRetryable, "rate_limit_error": ClassRetryable, "429": ClassRetryable,
	"tokens": ClassRetryable, "requests": ClassRetryable,

	"context_length_exceeded": ClassPassThrough, "invalid_request_error": ClassPassThrough, "invalid_prompt": ClassPassThrough,
	"invalid_value": ClassPassThrough, "invalid_api_key": ClassPassThrough, "model_not_found": ClassPassThrough,
	"content_filter": ClassPassThrough, "content_policy_violation": ClassPassThrough,
	"string_above_max_length": ClassPassThrough, "unsupported_value": ClassPassThrough,
	"unsupported_parameter": ClassPassThrough, "missing_required_parameter": ClassPassThrough,
	"invalid_type": ClassPassThrough, "insufficient_quota": ClassPassThrough, "billing_hard_limit_reached": ClassPassThrough,
	"invalid_image": ClassPassThrough, "invalid_image_url": ClassPassThrough, "invalid_image_format": ClassPassThrough,
	"invalid_base64_image": ClassPassThrough, "image_too_large": ClassPassThrough, "image_too_small": ClassPassThrough,
	"image_parse_error": ClassPassThrough, "image_content_policy_violation": ClassPassThrough,
	"invalid_image_mode": ClassPassThrough, "image_file_too_large": ClassPassThrough,
	"unsupported_image_media_type": ClassPassThrough, "empty_image_file": ClassPassThrough,
	"failed_to_download_image": ClassPassThrough, "image_file_not_found": ClassPassThrough,
	"authentication_error": ClassPassThrough, "permission_error": ClassPassThrough, "not_found_error": ClassPassThrough,
	"request_too_large": ClassPassThrough, "billing_error": ClassPassThrough,
	"400": ClassPassThrough, "401": ClassPassThrough, "403": ClassPassThrough, "404": ClassPassThrough,
	"422": ClassPassThrough,
}

// EventFailure classifies an in-band failure before the commit point the
// way a status would be: a rate limit like a 429, the client's own
// mistake (an invalid request, a context too long) like a pass-through
// 4xx — its stream goes to the client as sent — and anything else
// (overloaded, a server error, unknown) like a 5xx.
func EventFailure(code string) Verdict {
	switch c, ok := eventClass[code]; {
	case ok && c == ClassRetryable:
		return Verdict{Class: ClassRetryable, Reason: Reason429, Health: HealthExcluded}
	case ok:
		return Verdict{Class: ClassPassThrough, Health: HealthSuccess}
	}
	return Verdict{Class: ClassRetryable, Reason: Reason5xx, Health: HealthFailure}
}
