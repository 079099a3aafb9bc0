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
		{"no usage", APIChat, `{"choices":[]}`, Usage{}},
		{"usage: null only", APIChat, `{"usage":null}`, Usage{}},
	} {
		if got := ReadUsage(tt.api, []byte(tt.body)); got != tt.want {
			t.Errorf("%s: %+v, want %+v", tt.name, got, tt.want)
		}
	}
}
