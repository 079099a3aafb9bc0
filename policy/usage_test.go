package policy

import "testing"

func TestReadUsage(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		api  API
		body string
		want Usage
	}{
		{"chat", APIChat, `{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}`, Usage{12, 5, true}},
		{"a chat stream's usage chunk", APIChat, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"usage\":null}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":9}}\n\ndata: [DONE]\n\n", Usage{3, 9, true}},
		{"embeddings: the input only", APIOther, `{"data":[],"usage":{"prompt_tokens":8,"total_tokens":8}}`, Usage{8, 0, true}},
		{"a server naming them input/output", APIChat, `{"usage":{"input_tokens":4,"output_tokens":2}}`, Usage{4, 2, true}},
		{"responses: response.completed", APIResponses, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":20,\"output_tokens\":7,\"total_tokens\":27}}}\n\n", Usage{20, 7, true}},
		{"anthropic, a body: cached input counts", APIAnthropic, `{"type":"message","usage":{"input_tokens":10,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"output_tokens":6}}`, Usage{1110, 6, true}},
		{"anthropic, a stream: input from message_start, output the last delta's (cumulative)", APIAnthropic,
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"cache_read_input_tokens\":1,\"output_tokens\":1}}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":5}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":12}}\n\n", Usage{10, 12, true}},
		{"anthropic, a delta's input null: message_start's", APIAnthropic,
			"data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n" +
				"data: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":null,\"output_tokens\":4}}\n\n", Usage{9, 4, true}},
		{"ollama", APIOllama, "{\"message\":{\"content\":\"a\"},\"done\":false}\n{\"done\":true,\"prompt_eval_count\":26,\"eval_count\":290}\n", Usage{26, 290, true}},
		{"ollama, a cached prompt: input 0", APIOllama, `{"done":true,"eval_count":40}`, Usage{0, 40, true}},
		{"responses: a client's metadata usage after the real one", APIResponses,
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":50000,\"output_tokens\":7},\"metadata\":{\"usage\":\"x\"}}}\n\n", Usage{50000, 7, true}},
		{"responses, a body: metadata echoes a usage object", APIResponses,
			`{"usage":{"input_tokens":30,"output_tokens":3},"metadata":{"usage":{"input_tokens":1,"output_tokens":1}},"text":"\"usage\":{\"input_tokens\":2}"}`, Usage{30, 3, true}},
		{"chat: a usage inside a message is not the usage", APIChat,
			`{"choices":[{"message":{"content":"{\"usage\":{\"prompt_tokens\":1}}","usage":{"prompt_tokens":1}}}],"usage":{"prompt_tokens":40,"completion_tokens":4}}`, Usage{40, 4, true}},
		{"no usage", APIChat, `{"choices":[]}`, Usage{}},
		{"usage: null only", APIChat, `{"usage":null}`, Usage{}},
	} {
		if got := ReadUsage(tt.api, []byte(tt.body)); got != tt.want {
			t.Errorf("%s: %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

// FuzzUsageReader: a reply fed in pieces reads as it does whole, and no
// input panics.
func FuzzUsageReader(f *testing.F) {
	f.Add("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":7},\"metadata\":{\"usage\":\"x\"}}}\n\n", uint8(3))
	f.Add(`{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5}}`, uint8(1))
	f.Add("{\"done\":true,\"prompt_eval_count\":26,\"eval_count\":290}\n", uint8(7))
	f.Fuzz(func(t *testing.T, body string, step uint8) {
		for _, api := range []API{APIChat, APIResponses, APIAnthropic, APIOllama} {
			whole := ReadUsage(api, []byte(body))
			var r UsageReader
			r.Start(api)
			n := int(step%16) + 1
			for i := 0; i < len(body); i += n {
				r.Feed([]byte(body[i:min(i+n, len(body))]))
			}
			if got := r.Usage(); got != whole {
				t.Fatalf("api %d, %q in pieces of %d: %+v, whole %+v", api, body, n, got, whole)
			}
		}
	})
}
