package policy

import (
	"bytes"

	"github.com/tidwall/gjson"
)

// Usage is what a reply says it used, in tokens; Known says it said.
type Usage struct {
	Input, Output int64
	Known         bool
}

// ReadUsage reads the usage a reply body tells, or the last bytes of a
// stream (its last usage is its whole), by its API's rules:
//   - chat, completions, embeddings: the last "usage" object's
//     prompt_tokens and completion_tokens (an embedding's output is 0;
//     input_tokens/output_tokens where a server names them so);
//   - Responses: the last usage's input_tokens and output_tokens (the
//     stream's response.completed);
//   - Anthropic: the input is input_tokens + cache_creation_input_tokens +
//     cache_read_input_tokens — a stream tells them in message_start, the
//     first usage, unless its last usage repeats them (b must hold
//     message_start for them: 0 else) — and the output the
//     last usage's output_tokens (message_delta's is cumulative: adding
//     message_start's would count it twice);
//   - Ollama: the last prompt_eval_count and eval_count (a cached prompt
//     has no prompt_eval_count: 0).
func ReadUsage(api API, b []byte) Usage {
	if api == APIOllama {
		in, inOK := lastNumber(b, `"prompt_eval_count":`)
		out, outOK := lastNumber(b, `"eval_count":`)
		return Usage{Input: in, Output: out, Known: inOK || outOK}
	}
	i := bytes.LastIndex(b, []byte(`"usage":`))
	if i < 0 {
		return Usage{}
	}
	last := gjson.ParseBytes(b[i+len(`"usage":`):])
	if !last.IsObject() {
		return Usage{}
	}
	inKey, outKey := "prompt_tokens", "completion_tokens"
	if api == APIResponses || api == APIAnthropic || !last.Get(inKey).Exists() && !last.Get(outKey).Exists() {
		inKey, outKey = "input_tokens", "output_tokens"
	}
	in, out := last.Get(inKey), last.Get(outKey)
	u := Usage{Input: in.Int(), Output: out.Int(), Known: in.Exists() || out.Exists()}
	if api == APIAnthropic {
		told := last
		if in.Type != gjson.Number { // a stream's message_delta (none, or null): the input was in message_start
			if j := bytes.Index(b, []byte(`"usage":`)); j >= 0 && j < i {
				told = gjson.ParseBytes(b[j+len(`"usage":`):])
			}
		}
		u.Input = told.Get("input_tokens").Int() + told.Get("cache_creation_input_tokens").Int() +
			told.Get("cache_read_input_tokens").Int()
	}
	return u
}

// lastNumber is the number after the last key in b.
func lastNumber(b []byte, key string) (int64, bool) {
	i := bytes.LastIndex(b, []byte(key))
	if i < 0 {
		return 0, false
	}
	v := gjson.ParseBytes(b[i+len(key):])
	return v.Int(), v.Type == gjson.Number
}

// UsageChunk reports whether a chat or legacy completions stream's chunk
// is the one stream_options.include_usage adds: a usage, no choices.
func UsageChunk(data []byte) bool {
	if !bytes.Contains(data, []byte(`"usage":`)) {
		return false
	}
	c := gjson.GetBytes(data, "choices")
	return gjson.GetBytes(data, "usage").IsObject() && (!c.Exists() || c.IsArray() && c.Get("#").Int() == 0)
}

// AsksUsage reports whether a chat or legacy completions request body
// asks for a stream with its usage (stream_options.include_usage), and
// whether it asks for a stream at all.
func AsksUsage(body []byte) (stream, usage bool) {
	r := gjson.GetManyBytes(body, "stream", "stream_options.include_usage")
	return r[0].Bool(), r[1].Bool()
}
