package policy

import "testing"

func TestContinuable(t *testing.T) {
	for _, tt := range []struct{ body, why string }{
		{`{"model":"m","stream":true,"messages":[]}`, ""},
		{`{"n":1,"logprobs":false,"response_format":{"type":"text"}}`, ""},
		{`{"n":2}`, "n"},
		{`{"logprobs":true}`, "logprobs"},
		{`{"top_logprobs":3}`, "logprobs"},
		{`{"response_format":{"type":"json_schema","json_schema":{}}}`, "response_format"},
		{`{"response_format":{"type":"json_object"}}`, "response_format"},
	} {
		if got := Continuable([]byte(tt.body)); got != tt.why {
			t.Errorf("%s: %q, want %q", tt.body, got, tt.why)
		}
	}
}

func TestFollowChunk(t *testing.T) {
	if id, _, _ := FollowChunk([]byte(`{"id":"chatcmpl-9","choices":[]}`)); id != "chatcmpl-9" {
		t.Errorf("id %q", id)
	}
	for _, tt := range []struct{ chunk, text, blocker string }{
		{`{"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}`, "Hel", ""},
		{`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`, "", ""},
		{`{"choices":[{"index":0,"delta":{"content":"x","tool_calls":null,"audio":{},"function_call":null}}]}`, "x", ""},
		{`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a"}}]}}]}`, "", "tool_calls"},
		{`{"choices":[{"index":0,"delta":{"function_call":{"arguments":"{"}}}]}`, "", "tool_calls"},
		{`{"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}`, "", "reasoning"},
		{`{"choices":[{"index":0,"delta":{"reasoning":"hmm"}}]}`, "", "reasoning"},
		{`{"choices":[{"index":0,"delta":{"refusal":"no"}}]}`, "", "refusal"},
		{`{"choices":[{"index":0,"delta":{"audio":{"data":"AAA"}}}]}`, "", "audio"},
		{`{"choices":[{"index":0,"delta":{"content":"."},"finish_reason":"stop"}]}`, ".", "finished"},
		{`{"choices":[],"usage":{"total_tokens":3}}`, "", ""},
	} {
		_, text, blocker := FollowChunk([]byte(tt.chunk))
		if text != tt.text || blocker != tt.blocker {
			t.Errorf("%s: %q %q, want %q %q", tt.chunk, text, blocker, tt.text, tt.blocker)
		}
	}
}
