package policy

import (
	"bytes"

	"github.com/tidwall/gjson"
)

// API is the streaming API a reply speaks, which says where its commit
// point is.
type API uint8

// The APIs whose streams Sturdy reads before committing them.
const (
	// APIOther: committed at the first body byte.
	APIOther API = iota
	// APIChat: OpenAI chat completions SSE (…/chat/completions).
	APIChat
	// APICompletions: legacy completions SSE (…/completions).
	APICompletions
	// APIResponses: the Responses API SSE (…/responses).
	APIResponses
	// APIOllama: Ollama's NDJSON (/api/chat, /api/generate).
	APIOllama
)

// APIOf tells a request's streaming API from its path (without query).
func APIOf(path []byte) API {
	if n := len(path); n > 1 && path[n-1] == '/' {
		path = path[:n-1]
	}
	switch {
	case bytes.HasSuffix(path, []byte("/chat/completions")):
		return APIChat
	case bytes.HasSuffix(path, []byte("/completions")):
		return APICompletions
	case bytes.HasSuffix(path, []byte("/responses")):
		return APIResponses
	case bytes.HasSuffix(path, []byte("/api/chat")), bytes.HasSuffix(path, []byte("/api/generate")):
		return APIOllama
	}
	return APIOther
}

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

// Event is one stream event as the proxy read it: its name (SSE
// "event:", empty for NDJSON and unnamed events) and its data (the JSON
// value).
type Event struct {
	Name []byte
	Data []byte
}

// Judge says what an event before the commit point means for api: output
// (commit), framing (hold it and read on) or a failure. On a failure it
// also returns the error's code (or type) as the upstream wrote it, for
// EventFailure and the access log.
func Judge(api API, ev Event) (mark Mark, code string) {
	data := gjson.ParseBytes(ev.Data)
	switch api {
	case APIChat, APICompletions:
		if e := data.Get("error"); e.Exists() {
			return MarkFailure, errorCode(e)
		}
		return chunkMark(api, data), ""
	case APIResponses:
		typ := string(ev.Name)
		if typ == "" {
			typ = data.Get("type").String()
		}
		switch typ {
		case "response.created", "response.in_progress", "response.queued", "":
			return MarkFraming, ""
		case "error":
			return MarkFailure, errorCode(data)
		case "response.failed":
			return MarkFailure, errorCode(data.Get("response.error"))
		}
		return MarkContent, ""
	case APIOllama:
		if e := data.Get("error"); e.Exists() {
			return MarkFailure, e.String()
		}
		if data.Get("done").Bool() || data.Get("message.content").String() != "" || data.Get("response").String() != "" ||
			data.Get("message.tool_calls").Exists() || data.Get("message.thinking").String() != "" {
			return MarkContent, ""
		}
		return MarkFraming, ""
	}
	return MarkContent, ""
}

// chunkMark finds output in a chat (or legacy completions) chunk.
func chunkMark(api API, chunk gjson.Result) Mark {
	if u := chunk.Get("usage"); u.Exists() && u.Type != gjson.Null {
		return MarkContent
	}
	for _, c := range chunk.Get("choices").Array() {
		if f := c.Get("finish_reason"); f.Exists() && f.Type != gjson.Null {
			return MarkContent
		}
		if api == APICompletions {
			if c.Get("text").String() != "" {
				return MarkContent
			}
			continue
		}
		d := c.Get("delta")
		for _, k := range []string{"content", "refusal", "reasoning_content", "reasoning"} {
			if d.Get(k).String() != "" {
				return MarkContent
			}
		}
		if tc := d.Get("tool_calls"); tc.IsArray() && len(tc.Array()) > 0 {
			return MarkContent
		}
	}
	return MarkFraming
}

// errorCode is an error object's code, else its type.
func errorCode(e gjson.Result) string {
	if c := e.Get("code"); c.Exists() && c.Type != gjson.Null && c.String() != "" {
		return c.String()
	}
	return e.Get("type").String()
}

// EventFailure classifies an in-band failure before the commit point the
// way a status would be: a rate limit like a 429, the client's own
// mistake (an invalid request, a context too long) like a pass-through
// 4xx — its stream goes to the client as sent — and anything else
// (overloaded, a server error, unknown) like a 5xx.
func EventFailure(code string) Verdict {
	switch code {
	case "rate_limit_exceeded", "rate_limit_error", "429", "tokens", "requests":
		return Verdict{Class: ClassRetryable, Reason: Reason429, Health: HealthExcluded}
	case "context_length_exceeded", "invalid_request_error", "invalid_prompt", "invalid_value", "invalid_api_key",
		"model_not_found", "content_filter", "content_policy_violation", "string_above_max_length",
		"400", "401", "403", "404", "422":
		return Verdict{Class: ClassPassThrough, Health: HealthSuccess}
	}
	return Verdict{Class: ClassRetryable, Reason: Reason5xx, Health: HealthFailure}
}
