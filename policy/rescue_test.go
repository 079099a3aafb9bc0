package policy

import (
	"testing"
	"time"
)

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

func TestRescueRefusal(t *testing.T) {
	t.Parallel()
	ok := Rescue{HasTarget: true, MaxRescues: 1, MaxTotal: 3, Total: 1, Remaining: time.Minute, Elapsed: time.Second}
	with := func(f func(*Rescue)) Rescue { r := ok; f(&r); return r }
	for _, tt := range []struct {
		name string
		r    Rescue
		want string
	}{
		{"continued", ok, ""},
		{"text past max_rescue_bytes", with(func(r *Rescue) { r.Blocker = RescueTooLarge }), "too_large"},
		{"no room in the buffers", with(func(r *Rescue) { r.Blocker = RescueBuffers }), "max_buffered_bytes"},
		{"a tool call streamed", with(func(r *Rescue) { r.Blocker = "tool_calls" }), "unsafe"},
		{"a bound beats no target", with(func(r *Rescue) { r.Blocker = RescueTooLarge; r.HasTarget = false }), "too_large"},
		{"no target can continue", with(func(r *Rescue) { r.HasTarget = false }), "no_target"},
		{"max_rescues used", with(func(r *Rescue) { r.Tries = 1 }), "exhausted"},
		{"max_rescues 0", with(func(r *Rescue) { r.MaxRescues = 0 }), "exhausted"},
		{"max_total_attempts used", with(func(r *Rescue) { r.Total = 3 }), "exhausted"},
		{"deadline passed", with(func(r *Rescue) { r.Remaining = 0 }), "exhausted"},
		{"max_duration passed", with(func(r *Rescue) { r.MaxDuration = time.Second }), "exhausted"},
		{"max_duration not yet", with(func(r *Rescue) { r.MaxDuration = 2 * time.Second }), ""},
		{"shut down or client left", with(func(r *Rescue) { r.Interrupted = true }), "interrupted"},
		{"exhausted beats interrupted", with(func(r *Rescue) { r.Interrupted = true; r.Tries = 1 }), "exhausted"},
		{"no retry left in the budget", with(func(r *Rescue) { r.BudgetSpent = true }), "budget"},
		{"interrupted beats the budget", with(func(r *Rescue) { r.BudgetSpent = true; r.Interrupted = true }), "interrupted"},
	} {
		if got := tt.r.Refusal(); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestRescueNext(t *testing.T) {
	t.Parallel()
	if RescueNext(1, true) != 1 || RescueNext(1, false) != 2 {
		t.Fatal("a retryable failure stays on its target, a refusal moves on")
	}
}

func TestContinuableMessages(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ body, why string }{
		{`{"model":"m","max_tokens":9,"stream":true,"messages":[]}`, ""},
		{`{"thinking":{"type":"disabled"}}`, ""},
		{`{"thinking":{"type":"enabled","budget_tokens":2048}}`, "thinking"},
		{`{"thinking":{"type":"adaptive"}}`, "thinking"},
		{`{"output_format":{"type":"json_schema","schema":{}}}`, "response_format"},
		{`{"output_config":{"format":{"type":"json_schema","schema":{}}}}`, "response_format"},
		{`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Sure:"}]}`, ""},
		{`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"Sure:"}]}]}`, ""},
		{`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]}]}`, "prefill"},
		{`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[]}]}`, "prefill"},
	} {
		if got := ContinuableMessages([]byte(tt.body)); got != tt.why {
			t.Errorf("%s: %q, want %q", tt.body, got, tt.why)
		}
	}
}

func TestFollowMessage(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, data string
		want       MessageEvent
	}{
		{"message_start", `{"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":9,"output_tokens":1}}}`,
			MessageEvent{Type: "message_start", Index: -1, OutputTokens: 1}},
		{"", `{"type":"ping"}`, MessageEvent{Type: "ping", Index: -1, OutputTokens: -1}},
		{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
			MessageEvent{Type: "content_block_start", Index: 0, Block: "text", OutputTokens: -1}},
		{"content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"text","text":"Hi"}}`,
			MessageEvent{Type: "content_block_start", Index: 1, Block: "text", Text: "Hi", OutputTokens: -1}},
		{"content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"f","input":{}}}`,
			MessageEvent{Type: "content_block_start", Index: 1, Block: "tool_use", Blocker: "tool_use", OutputTokens: -1}},
		{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"server_tool_use","id":"srvtoolu_1"}}`,
			MessageEvent{Type: "content_block_start", Index: 0, Block: "server_tool_use", Blocker: "tool_use", OutputTokens: -1}},
		{"content_block_start", `{"type":"content_block_start","index":2,"content_block":{"type":"web_search_tool_result"}}`,
			MessageEvent{Type: "content_block_start", Index: 2, Block: "web_search_tool_result", Blocker: "tool_use", OutputTokens: -1}},
		{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}`,
			MessageEvent{Type: "content_block_start", Index: 0, Block: "thinking", Blocker: "thinking", OutputTokens: -1}},
		{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"redacted_thinking","data":"x"}}`,
			MessageEvent{Type: "content_block_start", Index: 0, Block: "redacted_thinking", Blocker: "thinking", OutputTokens: -1}},
		{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"hologram"}}`,
			MessageEvent{Type: "content_block_start", Index: 0, Block: "hologram", Blocker: "unknown", OutputTokens: -1}},
		{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}`,
			MessageEvent{Type: "content_block_delta", Index: 0, Text: "Hel", OutputTokens: -1}},
		{"content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a"}}`,
			MessageEvent{Type: "content_block_delta", Index: 1, Blocker: "tool_use", OutputTokens: -1}},
		{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}`,
			MessageEvent{Type: "content_block_delta", Index: 0, Blocker: "thinking", OutputTokens: -1}},
		{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"s"}}`,
			MessageEvent{Type: "content_block_delta", Index: 0, Blocker: "thinking", OutputTokens: -1}},
		{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"citations_delta","citation":{}}}`,
			MessageEvent{Type: "content_block_delta", Index: 0, Blocker: "citations", OutputTokens: -1}},
		{"content_block_stop", `{"type":"content_block_stop","index":3}`, MessageEvent{Type: "content_block_stop", Index: 3, OutputTokens: -1}},
		{"message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}`,
			MessageEvent{Type: "message_delta", Index: -1, OutputTokens: 15, Blocker: "finished"}},
		{"message_delta", `{"type":"message_delta","delta":{"stop_reason":null},"usage":{"output_tokens":7}}`,
			MessageEvent{Type: "message_delta", Index: -1, OutputTokens: 7}},
		{"message_stop", `{"type":"message_stop"}`, MessageEvent{Type: "message_stop", Index: -1, OutputTokens: -1}},
	} {
		if got := FollowMessage([]byte(tt.name), []byte(tt.data)); got != tt.want {
			t.Errorf("%s %s:\n%+v, want\n%+v", tt.name, tt.data, got, tt.want)
		}
	}
}
