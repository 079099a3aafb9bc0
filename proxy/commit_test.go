package proxy

import (
	"strings"
	"testing"
	"time"

	"sturdy/internal/upstreamtest"
)

// Streams in each API's shape, for the commit tests.
var (
	roleChunk  = `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n"
	vllmError  = `data: {"error":{"object":"error","message":"the engine is overloaded","type":"InternalServerError","code":503}}` + "\n\ndata: [DONE]\n\n"
	tooLong    = `data: {"error":{"message":"too long","type":"invalid_request_error","code":"context_length_exceeded"}}` + "\n\n"
	created    = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{}}\n\n"
	inProgress = "event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"sequence_number\":1}\n\n"
	respError  = "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"boom\",\"param\":null,\"sequence_number\":2}\n\n"
	respDelta  = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":2,\"delta\":\"Hi\"}\n\n"
	respDone   = "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":3,\"response\":{}}\n\n"
)

func sseStep(chunks ...string) upstreamtest.Step {
	return upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: chunks}
}

// TestAStreamIsCommittedOnItsFirstOutput: framing before a stream's first
// output is held, so an error event there is retried like any failure.
func TestAStreamIsCommittedOnItsFirstOutput(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, path string
		steps      []upstreamtest.Step
		want       string
	}{
		{"responses: created then error", "/v1/responses",
			[]upstreamtest.Step{sseStep(created, respError), sseStep(created, inProgress, respDelta, respDone)},
			created + inProgress + respDelta + respDone},
		{"chat: role chunk then vLLM's error", "/v1/chat/completions",
			[]upstreamtest.Step{sseStep(roleChunk, vllmError), sseStep(append([]string{roleChunk}, upstreamtest.SSE("Hi")...)...)},
			roleChunk + strings.Join(upstreamtest.SSE("Hi"), "")},
		{"ollama: an error line first", "/api/chat",
			[]upstreamtest.Step{{Header: [][2]string{{"Content-Type", "application/x-ndjson"}}, Chunks: []string{`{"error":"model is loading"}` + "\n"}},
				{Header: [][2]string{{"Content-Type", "application/x-ndjson"}}, Chunks: []string{`{"message":{"content":"Hi"},"done":false}` + "\n", `{"done":true}` + "\n"}}},
			`{"message":{"content":"Hi"},"done":false}` + "\n" + `{"done":true}` + "\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			up := upstreamtest.Start(t, tt.steps...)
			h := startProxy(t, up.URL, nil)
			resp, body := h.do("POST", tt.path, `{"model":"m","stream":true}`, "Content-Type", "application/json")
			if resp.StatusCode != 200 || string(body) != tt.want || resp.Header.Get("X-Sturdy-Attempts") != "2" {
				t.Fatalf("%d, attempts %s: %q", resp.StatusCode, resp.Header.Get("X-Sturdy-Attempts"), body)
			}
			if line := h.accessLines(1)[0]; line["ttft_ms"] == nil || line["outcome"] != "ok" {
				t.Fatalf("access line %v", line)
			}
		})
	}
}

// TestTheClientsOwnErrorInAStreamGoesToIt: an error event that is the
// request's fault goes to the client as sent — or to the next target
// when the route fails over on its code.
func TestTheClientsOwnErrorInAStreamGoesToIt(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, sseStep(roleChunk, tooLong))
	h := startProxy(t, up.URL, nil)
	resp, body := h.chat(`{"stream":true}`)
	if resp.StatusCode != 200 || string(body) != roleChunk+tooLong || up.Count() != 1 {
		t.Fatalf("%d after %d requests: %q", resp.StatusCode, up.Count(), body)
	}

	bigger := upstreamtest.Start(t, sseStep(append([]string{roleChunk}, upstreamtest.SSE("Hi")...)...))
	h = startProxy(t, up.URL, func(o *Options) {
		withFallbacks(o, []string{bigger.URL}, "bigger-model")
		o.Routes[0].FailoverCodes = []string{"context_length_exceeded"}
	})
	resp, body = h.chat(`{"stream":true}`)
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"Hi"`) || bigger.Count() != 1 {
		t.Fatalf("failover_codes on an in-band error: %d %q", resp.StatusCode, body)
	}
}

// TestFirstTokenRunsToTheFirstOutput: framing at once does not satisfy
// first_token; the attempt is abandoned for the next target.
func TestFirstTokenRunsToTheFirstOutput(t *testing.T) {
	t.Parallel()
	slow := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader},
		Chunks: []string{roleChunk, upstreamtest.SSE("late")[0]}, ChunkDelay: 2 * time.Second})
	fast := upstreamtest.Start(t, sseStep(upstreamtest.SSE("fast")...))
	h := startProxy(t, slow.URL, func(o *Options) {
		o.Routes[0].FirstToken = 300 * time.Millisecond
		o.Routes[0].Retry.MaxAttempts = 1
		withFallbacks(o, []string{fast.URL})
	})
	start := time.Now()
	_, body := h.chat(`{"stream":true}`)
	if !strings.Contains(string(body), `"fast"`) || strings.Contains(string(body), "assistant") || time.Since(start) > 1500*time.Millisecond {
		t.Fatalf("after %v: %q", time.Since(start), body)
	}
}

// TestLargeFramingIsCommittedPastTheHold: past 1 MiB of framing the
// stream is committed as it is.
func TestLargeFramingIsCommittedPastTheHold(t *testing.T) {
	t.Parallel()
	huge := "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"instructions\":\"" +
		strings.Repeat("x", 1_200_000) + "\"}}\n\n"
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: []string{huge, respDelta, respDone}})
	h := startProxy(t, up.URL, nil)
	resp, body := h.do("POST", "/v1/responses", `{"stream":true}`)
	if resp.StatusCode != 200 || string(body) != huge+respDelta+respDone {
		t.Fatalf("%d, %d bytes", resp.StatusCode, len(body))
	}
}

// TestResponsesStreamCutAfterCommitEndsWithAnErrorEvent: the in-band
// error after commit is the Responses API's own error event, numbered on.
func TestResponsesStreamCutAfterCommitEndsWithAnErrorEvent(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader},
		Chunks: []string{created, inProgress, respDelta}, Fault: upstreamtest.Cut})
	h := startProxy(t, up.URL, nil)
	_, body := h.do("POST", "/v1/responses", `{"stream":true}`)
	tail := strings.TrimPrefix(string(body), created+inProgress+respDelta)
	if !strings.HasPrefix(tail, "event: error\ndata: {\"type\":\"error\",\"code\":\"stream_interrupted\"") ||
		!strings.Contains(tail, `"sequence_number":3`) || !strings.Contains(tail, `"error":{"message"`) {
		t.Fatalf("tail %q", tail)
	}
}
