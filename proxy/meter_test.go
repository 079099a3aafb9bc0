package proxy

import (
	"strings"
	"testing"

	"sturdy/events"
	"sturdy/policy"
)

// TestMeterReadsUsageAsItIsRelayed: a reply's usage, model and streamed
// text, whatever pieces its bytes come in (usage by the API's rules:
// policy.ReadUsage, table-tested there).
func TestMeterReadsUsageAsItIsRelayed(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 3*meterHold)
	for _, c := range []struct {
		name string
		api  policy.API
		kind events.Kind
		body string
		want usage
		// slack is how far streamed may pass want's: an event over
		// meterHold counts its bytes as text.
		slack int64
	}{
		{"chat body", policy.APIChat, 0, `{"model":"gpt-4o-2024","choices":[{"message":{"content":"hello"}}],"usage":{"prompt_tokens":5,"completion_tokens":9}}`,
			usage{"gpt-4o-2024", policy.Usage{Input: 5, Output: 9, Known: true}, 2}, 0},
		{"chat stream", policy.APIChat, events.SSE, "data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"abcdefgh\"}}],\"usage\":null}\n\n" +
			"data: {\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n",
			usage{"m", policy.Usage{Input: 1, Output: 2, Known: true}, 2}, 0},
		{"chat stream cut before its usage", policy.APIChat, events.SSE, "data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"abcdefghi\"}}],\"usage\":null}\n\n",
			usage{"m", policy.Usage{}, 3}, 0},
		{"responses", policy.APIResponses, events.SSE, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"abcd\"}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"o3\",\"output\":[{\"text\":\"" + long + "\"}],\"usage\":{\"input_tokens\":4,\"output_tokens\":2}}}\n\n",
			usage{"", policy.Usage{Input: 4, Output: 2, Known: true}, 1}, 0},
		{"anthropic stream, long", policy.APIAnthropic, events.SSE, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude\",\"usage\":{\"input_tokens\":3,\"cache_read_input_tokens\":7,\"output_tokens\":1}}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"" + long + "\"}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":40}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
			usage{"claude", policy.Usage{Input: 10, Output: 40, Known: true}, int64(len(long)+3) / 4}, 50},
		{"ollama", policy.APIOllama, events.NDJSON, "{\"model\":\"llama3\",\"message\":{\"content\":\"abcd\"}}\n{\"model\":\"llama3\",\"done\":true,\"prompt_eval_count\":26,\"eval_count\":290}\n",
			usage{"llama3", policy.Usage{Input: 26, Output: 290, Known: true}, 1}, 0},
		{"ollama, cached prompt", policy.APIOllama, events.NDJSON, "{\"model\":\"llama3\",\"done\":true,\"eval_count\":2}\n",
			usage{"llama3", policy.Usage{Output: 2, Known: true}, 0}, 0},
		{"a long body of no framing", policy.APIChat, 0, `{"model":"m","choices":[{"message":{"content":"` + long + `"}}],"usage":{"prompt_tokens":1,"completion_tokens":7}}`,
			usage{"", policy.Usage{Input: 1, Output: 7, Known: true}, 0}, 0},
		{"none", policy.APIOther, 0, `{"data":[1,2]}`, usage{}, 0},
	} {
		for _, piece := range []int{1, 7, 4096, len(c.body)} {
			var m meter
			m.start(c.api, c.kind)
			for b := []byte(c.body); len(b) > 0; {
				n := min(piece, len(b))
				m.feed(b[:n])
				b = b[n:]
			}
			m.end()
			got := m.result()
			if over := got.streamed - c.want.streamed; over >= 0 && over <= c.slack {
				got.streamed = c.want.streamed
			}
			if got != c.want {
				t.Errorf("%s, in pieces of %d: got %+v, want %+v", c.name, piece, got, c.want)
			}
			if cap(m.pending) > 2*meterHold+piece {
				t.Errorf("%s, in pieces of %d: the meter holds %d bytes", c.name, piece, cap(m.pending))
			}
		}
	}
}

// TestAContinuationIsMeteredApart: a rescued stream is charged the cut
// attempt's text ÷ 4 and the continuation's usage.
func TestAContinuationIsMeteredApart(t *testing.T) {
	t.Parallel()
	var m meter
	m.start(policy.APIChat, events.SSE)
	m.event([]byte(`{"choices":[{"delta":{"content":"abcdefgh"}}]}`)) // cut: 2 tokens
	m.cutOver()
	m.event([]byte(`{"choices":[{"delta":{"content":"ijkl"}}]}`))
	m.event([]byte(`{"choices":[],"usage":{"prompt_tokens":30,"completion_tokens":5}}`))
	if got, want := m.result(), (usage{"", policy.Usage{Input: 30, Output: 7, Known: true}, 3}); got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}
