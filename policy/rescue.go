package policy

import "github.com/tidwall/gjson"

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
