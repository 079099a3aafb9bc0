package proxy

import (
	"strings"
	"testing"
	"time"

	"sturdy/events"
	"sturdy/internal/upstreamtest"
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

// TestAClientsEchoedUsageIsNotTheUsage: a Responses reply whose
// metadata (the client's own, echoed back after usage) holds a "usage"
// is charged its real usage — whole, and as a stream whose
// response.completed outgrew what a meter keeps of an event. Before, the
// last "usage" key was taken: 50,000 tokens were charged as 145.
func TestAClientsEchoedUsageIsNotTheUsage(t *testing.T) {
	t.Parallel()
	text := strings.Repeat("word ", 4*meterHold/5) // the completed event is longer than meterHold
	response := `{"id":"r","object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"` + text + `"}]}],` +
		`"usage":{"input_tokens":40000,"output_tokens":10000,"total_tokens":50000},"metadata":{"usage":"x"}}`
	stream := "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\"}}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"word \"}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":" + response + "}\n\n"
	for _, tt := range []struct {
		name string
		step upstreamtest.Step
		body string
	}{
		{"whole", upstreamtest.Step{Header: [][2]string{{"Content-Type", "application/json"}}, Body: response},
			`{"model":"m","input":"hi","metadata":{"usage":"x"}}`},
		{"streamed", upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: []string{stream[:len(stream)/2], stream[len(stream)/2:]}},
			`{"model":"m","input":"hi","stream":true,"metadata":{"usage":"x"}}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			up := upstreamtest.Start(t, tt.step)
			h := budgeted(t, up.URL, TokenLimits{TokensPerMinute: 1_000_000})
			resp, b := h.do("POST", "/v1/responses", tt.body, "Content-Type", "application/json", "Authorization", "Bearer k")
			if resp.StatusCode != 200 || !strings.Contains(string(b), "10000") {
				t.Fatalf("%d %.200s", resp.StatusCode, b)
			}
			waitFor(t, 2*time.Second, "the usage settled", func() bool { return remaining(t, h, 1_000_000, "k") != 1_000_000-2 })
			if got := remaining(t, h, 1_000_000, "k"); got != 1_000_000-50_000 {
				t.Fatalf("remaining %d, want %d: charged %d", got, 1_000_000-50_000, 1_000_000-got)
			}
		})
	}
}
