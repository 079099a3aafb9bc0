package policy

import "testing"

func TestAPIOf(t *testing.T) {
	for path, want := range map[string]API{"/v1/chat/completions": APIChat, "/v1/completions": APICompletions,
		"/v1/responses": APIResponses, "/v1/responses/": APIResponses, "/api/chat": APIOllama, "/api/generate": APIOllama,
		"/v1/embeddings": APIOther, "/v1/models": APIOther} {
		if got := APIOf([]byte(path)); got != want {
			t.Errorf("%s: %v, want %v", path, got, want)
		}
	}
}

func TestJudge(t *testing.T) {
	tests := []struct {
		name  string
		api   API
		event string
		data  string
		mark  Mark
		code  string
	}{
		{"chat role-only first chunk", APIChat, "", `{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`, MarkFraming, ""},
		{"chat content", APIChat, "", `{"choices":[{"delta":{"content":"Hi"}}]}`, MarkContent, ""},
		{"chat tool call", APIChat, "", `{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"f"}}]}}]}`, MarkContent, ""},
		{"chat refusal", APIChat, "", `{"choices":[{"delta":{"refusal":"no"}}]}`, MarkContent, ""},
		{"chat reasoning_content", APIChat, "", `{"choices":[{"delta":{"reasoning_content":"hm"}}]}`, MarkContent, ""},
		{"chat reasoning", APIChat, "", `{"choices":[{"delta":{"reasoning":"hm"}}]}`, MarkContent, ""},
		{"chat finish_reason", APIChat, "", `{"choices":[{"delta":{},"finish_reason":"stop"}]}`, MarkContent, ""},
		{"chat usage chunk", APIChat, "", `{"choices":[],"usage":{"total_tokens":3}}`, MarkContent, ""},
		{"chat empty tool_calls", APIChat, "", `{"choices":[{"delta":{"tool_calls":[]}}]}`, MarkFraming, ""},
		{"chat choices as a lone object", APIChat, "", `{"choices":{"finish_reason":"stop"}}`, MarkContent, ""},
		{"chat choices an object of choices", APIChat, "", `{"choices":{"a":{"finish_reason":"stop"}}}`, MarkFraming, ""},
		{"chat choices null", APIChat, "", `{"choices":null}`, MarkFraming, ""},
		{"chat vLLM error", APIChat, "", `{"error":{"object":"error","message":"overloaded","type":"InternalServerError","code":503}}`, MarkFailure, "503"},
		{"chat error by type", APIChat, "", `{"error":{"message":"too long","type":"invalid_request_error","code":null}}`, MarkFailure, "invalid_request_error"},
		{"chat legacy function_call", APIChat, "", `{"choices":[{"delta":{"function_call":{"name":"f","arguments":""}}}]}`, MarkContent, ""},
		{"chat audio", APIChat, "", `{"choices":[{"delta":{"audio":{"id":"a","data":"AAA="}}}]}`, MarkContent, ""},
		{"chat invalid request of an unknown code", APIChat, "", `{"error":{"type":"invalid_request_error","code":"some_new_code"}}`, MarkFailure, "invalid_request_error"},
		{"chat known code under invalid_request_error", APIChat, "", `{"error":{"type":"invalid_request_error","code":"context_length_exceeded"}}`, MarkFailure, "context_length_exceeded"},
		{"responses failed on an image", APIResponses, "response.failed", `{"type":"response.failed","response":{"error":{"code":"invalid_image_url"}}}`, MarkFailure, "invalid_image_url"},
		{"legacy completions text", APICompletions, "", `{"choices":[{"text":"Hi"}]}`, MarkContent, ""},
		{"legacy completions empty", APICompletions, "", `{"choices":[{"text":""}]}`, MarkFraming, ""},
		{"responses created", APIResponses, "response.created", `{"type":"response.created","response":{"tools":[]}}`, MarkFraming, ""},
		{"responses in progress", APIResponses, "response.in_progress", `{}`, MarkFraming, ""},
		{"responses queued, unnamed", APIResponses, "", `{"type":"response.queued"}`, MarkFraming, ""},
		{"messages start", APIAnthropic, "message_start", `{"type":"message_start","message":{"id":"msg_1","content":[],"usage":{"input_tokens":9}}}`, MarkFraming, ""},
		{"messages ping", APIAnthropic, "ping", `{"type":"ping"}`, MarkFraming, ""},
		{"messages empty text block", APIAnthropic, "content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`, MarkFraming, ""},
		{"messages empty thinking block", APIAnthropic, "content_block_start", `{"index":0,"content_block":{"type":"thinking","thinking":""}}`, MarkFraming, ""},
		{"messages tool use block", APIAnthropic, "content_block_start", `{"index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}}`, MarkContent, ""},
		{"messages redacted thinking", APIAnthropic, "content_block_start", `{"index":0,"content_block":{"type":"redacted_thinking","data":"x"}}`, MarkContent, ""},
		{"messages text delta", APIAnthropic, "content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`, MarkContent, ""},
		{"messages block stop", APIAnthropic, "content_block_stop", `{"type":"content_block_stop","index":0}`, MarkFraming, ""},
		{"messages delta, an empty answer's stop", APIAnthropic, "message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":0}}`, MarkContent, ""},
		{"messages delta without a stop", APIAnthropic, "message_delta", `{"type":"message_delta","delta":{"stop_reason":null}}`, MarkFraming, ""},
		{"messages overloaded", APIAnthropic, "error", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, MarkFailure, "overloaded_error"},
		{"messages error, unnamed", APIAnthropic, "", `{"type":"error","error":{"type":"invalid_request_error","message":"x"}}`, MarkFailure, "invalid_request_error"},
		{"responses output item of unknown shape", APIResponses, "response.output_item.added", `{}`, MarkContent, ""},
		{"responses empty message item announced", APIResponses, "response.output_item.added", `{"type":"response.output_item.added","item":{"type":"message","id":"m","role":"assistant","content":[]}}`, MarkFraming, ""},
		{"responses empty reasoning item announced", APIResponses, "response.output_item.added", `{"item":{"type":"reasoning","id":"rs","summary":[]}}`, MarkFraming, ""},
		{"responses function call announced", APIResponses, "response.output_item.added", `{"item":{"type":"function_call","name":"get_weather","call_id":"c","arguments":""}}`, MarkContent, ""},
		{"responses empty text part announced", APIResponses, "response.content_part.added", `{"part":{"type":"output_text","text":"","annotations":[]}}`, MarkFraming, ""},
		{"responses part with text", APIResponses, "response.content_part.added", `{"part":{"type":"output_text","text":"Hi"}}`, MarkContent, ""},
		{"responses text delta", APIResponses, "", `{"type":"response.output_text.delta","delta":"Hi"}`, MarkContent, ""},
		{"responses error", APIResponses, "error", `{"type":"error","code":"server_error","message":"x"}`, MarkFailure, "server_error"},
		{"responses failed", APIResponses, "response.failed", `{"type":"response.failed","response":{"error":{"code":"rate_limit_exceeded"}}}`, MarkFailure, "rate_limit_exceeded"},
		{"ollama content", APIOllama, "", `{"message":{"role":"assistant","content":"Hi"},"done":false}`, MarkContent, ""},
		{"ollama empty", APIOllama, "", `{"message":{"role":"assistant","content":""},"done":false}`, MarkFraming, ""},
		{"ollama generate", APIOllama, "", `{"response":"Hi","done":false}`, MarkContent, ""},
		{"ollama done", APIOllama, "", `{"done":true}`, MarkContent, ""},
		{"ollama error", APIOllama, "", `{"error":"model is loading"}`, MarkFailure, "model is loading"},
		{"other", APIOther, "", `anything`, MarkContent, ""},
	}
	for _, tt := range tests {
		mark, code := Judge(tt.api, []byte(tt.event), []byte(tt.data))
		if mark != tt.mark || code != tt.code {
			t.Errorf("%s: %v %q, want %v %q", tt.name, mark, code, tt.mark, tt.code)
		}
	}
}

func TestEventFailure(t *testing.T) {
	for code, want := range map[string]Class{"rate_limit_exceeded": ClassRetryable, "server_error": ClassRetryable,
		"503": ClassRetryable, "overloaded_error": ClassRetryable, "": ClassRetryable, "model is loading": ClassRetryable,
		"context_length_exceeded": ClassPassThrough, "invalid_request_error": ClassPassThrough, "400": ClassPassThrough,
		"unsupported_value": ClassPassThrough, "missing_required_parameter": ClassPassThrough, "invalid_image_url": ClassPassThrough,
		"insufficient_quota": ClassPassThrough} {
		if v := EventFailure(code); v.Class != want {
			t.Errorf("%q: %v, want %v", code, v.Class, want)
		}
	}
	if v := EventFailure("rate_limit_exceeded"); v.Reason != Reason429 || v.Health != HealthExcluded {
		t.Errorf("a rate limit is a 429: %+v", v)
	}
	if v := Classify(Outcome{Status: 200, StreamFailed: true, StreamError: "server_error"}); v.Reason != Reason5xx {
		t.Errorf("an in-band server error is a 5xx: %+v", v)
	}
}
