package proxy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"sturdy/internal/upstreamtest"
	"sturdy/upstream"
)

// chunkOf is a chat.completion.chunk event of stream id saying word.
func chunkOf(id, word string) string {
	return fmt.Sprintf(`data: {"id":%q,"object":"chat.completion.chunk","created":2,"model":"other","choices":[{"index":0,"delta":{"content":%q},"finish_reason":null}]}`+"\n\n", id, word)
}

// continuationOf is the stream a continuing server sends: its own id, a
// role-only chunk, the words, a finish_reason and [DONE].
func continuationOf(words ...string) upstreamtest.Step {
	chunks := []string{`data: {"id":"chatcmpl-2","object":"chat.completion.chunk","created":2,"model":"other","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n"}
	for _, w := range words {
		chunks = append(chunks, chunkOf("chatcmpl-2", w))
	}
	chunks = append(chunks, `data: {"id":"chatcmpl-2","object":"chat.completion.chunk","created":2,"model":"other","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n", "data: [DONE]\n\n")
	return sseStep(chunks...)
}

// relabelled is what the client must see of a continuation: its chunks
// after the role-only one, with the first stream's id.
func relabelled(st upstreamtest.Step) string {
	return strings.ReplaceAll(strings.Join(st.Chunks[1:], ""), `"id":"chatcmpl-2"`, `"id":"chatcmpl-1"`)
}

// startRescue runs Sturdy with a primary (no continuation) and a
// fallback that continues as c.
func startRescue(t *testing.T, primary, fallback *upstreamtest.Server, c upstream.Continuation, edit func(*Options)) *harness {
	return startProxy(t, primary.URL, func(o *Options) {
		o.Upstreams[0].Timeouts.Idle = 300 * time.Millisecond
		fb := testUpstream("fb", fallback.URL)
		fb.Continuation = c
		o.Upstreams = append(o.Upstreams, fb)
		o.Routes[0].Fallbacks = []Target{{Upstream: "fb", Model: "other"}}
		if edit != nil {
			edit(o)
		}
	})
}

// TestACutStreamIsContinuedOnAFallback: a stream that fails after its
// commit — cut, stalled past idle, an in-band error — goes on as one
// stream from a fallback that continues the partial answer: the text
// byte-exact, one finish_reason, one [DONE].
func TestACutStreamIsContinuedOnAFallback(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		first upstreamtest.Step
		c     upstream.Continuation
	}{
		{"cut, prefill", cutAfter(upstreamtest.Cut, "Hel", "lo"), upstream.ContinuePrefill},
		{"stalled past idle, vllm", cutAfter(upstreamtest.Stall, "Hel", "lo"), upstream.ContinueVLLM},
		{"in-band error", sseStep(append(upstreamtest.SSE("Hel", "lo")[:2], vllmError)...), upstream.ContinuePrefill},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			primary := upstreamtest.Start(t, tt.first)
			cont := continuationOf(" wor", "ld")
			fallback := upstreamtest.Start(t, cont)
			h := startRescue(t, primary, fallback, tt.c, nil)
			resp, body := h.chat(streamChat)
			want := strings.Join(upstreamtest.SSE("Hel", "lo")[:2], "") + relabelled(cont)
			if resp.StatusCode != 200 || string(body) != want {
				t.Fatalf("%d:\n%s\nwant\n%s", resp.StatusCode, body, want)
			}
			reqs := fallback.Requests()
			if len(reqs) != 1 {
				t.Fatalf("the fallback saw %d requests", len(reqs))
			}
			sent := gjson.ParseBytes(reqs[0].Body)
			last := sent.Get("messages.@reverse.0")
			if sent.Get("model").Str != "other" || last.Get("role").Str != "assistant" || last.Get("content").Str != "Hello" ||
				sent.Get("messages.#").Int() != 2 {
				t.Fatalf("continuation request %s", reqs[0].Body)
			}
			vllm := sent.Get("continue_final_message").Bool() && sent.Get("add_generation_prompt").Exists() &&
				!sent.Get("add_generation_prompt").Bool()
			if vllm != (tt.c == upstream.ContinueVLLM) || (tt.c == upstream.ContinuePrefill && sent.Get("continue_final_message").Exists()) {
				t.Fatalf("continuation flags for %v: %s", tt.c, reqs[0].Body)
			}
			line := h.accessLines(1)[0]
			if line["outcome"] != "ok" || line["rescued"] != 1.0 || line["rescued_by"] != "fb" || line["first_usage"] != "unknown" ||
				line["seam_bytes"] != float64(len(strings.Join(upstreamtest.SSE("Hel", "lo")[:2], ""))) {
				t.Fatalf("access line %v", line)
			}
		})
	}
}

// toolCallChunk starts a tool call whose JSON arguments are partial.
const toolCallChunk = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a"}}]},"finish_reason":null}]}` + "\n\n"

// TestNoContinuationWhereItWouldCorrupt: a cut stream that streamed a
// tool call or reasoning, or whose request asks for n > 1, logprobs or a
// JSON schema, ends with the interruption event; nothing is sent to the
// fallback.
func TestNoContinuationWhereItWouldCorrupt(t *testing.T) {
	t.Parallel()
	hel := upstreamtest.SSE("Hel")[0]
	reasoning := `data: {"id":"chatcmpl-1","choices":[{"index":0,"delta":{"reasoning_content":"Let me think"},"finish_reason":null}]}` + "\n\n"
	for _, tt := range []struct {
		name, body string
		first      upstreamtest.Step
	}{
		{"a tool call streamed", streamChat, sseStep(hel, toolCallChunk)},
		{"reasoning streamed", streamChat, sseStep(reasoning, hel)},
		{"n > 1", `{"model":"m","stream":true,"n":2,"messages":[]}`, sseStep(hel)},
		{"logprobs", `{"model":"m","stream":true,"logprobs":true,"messages":[]}`, sseStep(hel)},
		{"a JSON schema", `{"model":"m","stream":true,"response_format":{"type":"json_schema","json_schema":{"name":"x"}},"messages":[]}`, sseStep(hel)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.first.Fault = upstreamtest.Cut
			primary, fallback := upstreamtest.Start(t, tt.first), upstreamtest.Start(t, continuationOf(" world"))
			h := startRescue(t, primary, fallback, upstream.ContinuePrefill, nil)
			resp, body := h.chat(tt.body)
			if s := string(body); resp.StatusCode != 200 || !strings.HasPrefix(s, strings.Join(tt.first.Chunks, "")) ||
				!strings.Contains(s, `"code":"stream_interrupted"`) || strings.Contains(s, "world") {
				t.Fatalf("%d: %q", resp.StatusCode, s)
			}
			if fallback.Count() != 0 {
				t.Fatalf("the fallback was sent %d requests", fallback.Count())
			}
			if line := h.accessLines(1)[0]; line["outcome"] != "stream_interrupted" || line["rescue_refused"] != "unsafe" {
				t.Fatalf("access line %v", line)
			}
		})
	}
}

// TestAContinuationGoesOnlyToATargetThatContinues: the fallback with
// continuation: none is passed over (never sent a partial answer); the
// next one, which continues, takes over.
func TestAContinuationGoesOnlyToATargetThatContinues(t *testing.T) {
	t.Parallel()
	primary := upstreamtest.Start(t, cutAfter(upstreamtest.Cut, "Hel"))
	refuser := upstreamtest.Start(t, sseStep(upstreamtest.SSE("restarted")...))
	cont := continuationOf("lo")
	continuer := upstreamtest.Start(t, cont)
	h := startRescue(t, primary, refuser, upstream.ContinueNone, func(o *Options) {
		c := testUpstream("c", continuer.URL)
		c.Continuation = upstream.ContinueVLLM
		o.Upstreams = append(o.Upstreams, c)
		o.Routes[0].Fallbacks = append(o.Routes[0].Fallbacks, Target{Upstream: "c"})
	})
	resp, body := h.chat(streamChat)
	if want := upstreamtest.SSE("Hel")[0] + relabelled(cont); resp.StatusCode != 200 || string(body) != want {
		t.Fatalf("%d: %q", resp.StatusCode, body)
	}
	if refuser.Count() != 0 || continuer.Count() != 1 {
		t.Fatalf("continuation none saw %d requests, the continuing one %d", refuser.Count(), continuer.Count())
	}
}

// TestMaxRescuesBoundsContinuations: an upstream that continues itself
// is asked again while max_rescues allows, each time with all the text
// so far; past it the stream ends with the interruption event.
func TestMaxRescuesBoundsContinuations(t *testing.T) {
	t.Parallel()
	second, third := continuationOf("B"), continuationOf("C")
	second.Chunks, third.Chunks = second.Chunks[:2], third.Chunks[:2] // role chunk and one word, then cut
	second.Fault, third.Fault = upstreamtest.Cut, upstreamtest.Cut
	up := upstreamtest.Start(t, cutAfter(upstreamtest.Cut, "A"), second, third, continuationOf("never"))
	h := startProxy(t, up.URL, func(o *Options) {
		o.Upstreams[0].Continuation = upstream.ContinuePrefill
		o.Routes[0].MaxRescues = new(2)
	})
	resp, body := h.chat(streamChat)
	s := string(body)
	want := upstreamtest.SSE("A")[0] + relabelled(second) + relabelled(third)
	if resp.StatusCode != 200 || !strings.HasPrefix(s, want) || !strings.Contains(s, `"code":"stream_interrupted"`) ||
		strings.Contains(s, "never") || strings.Contains(s, "[DONE]") {
		t.Fatalf("%d: %q", resp.StatusCode, s)
	}
	reqs := up.Requests()
	if len(reqs) != 3 {
		t.Fatalf("the upstream saw %d requests, want 1 + max_rescues", len(reqs))
	}
	if got := gjson.GetBytes(reqs[2].Body, "messages.@reverse.0.content").Str; got != "AB" {
		t.Fatalf("the second continuation carried %q, want all the text so far", got)
	}
	if line := h.accessLines(1)[0]; line["rescued"] != 2.0 || line["rescue_refused"] != "exhausted" {
		t.Fatalf("access line %v", line)
	}
}

// TestAContinuationThatFailsEndsTheStreamHonestly: a fallback that
// refuses the partial answer (400) does not become the client's answer:
// the stream ends with the interruption event.
func TestAContinuationThatFailsEndsTheStreamHonestly(t *testing.T) {
	t.Parallel()
	primary := upstreamtest.Start(t, cutAfter(upstreamtest.Cut, "Hel"))
	fallback := upstreamtest.Start(t, upstreamtest.Step{Status: 400, Header: [][2]string{upstreamtest.JSONHeader},
		Body: `{"error":{"message":"assistant prefill is not supported","type":"invalid_request_error"}}`})
	h := startRescue(t, primary, fallback, upstream.ContinuePrefill, nil)
	resp, body := h.chat(streamChat)
	s := string(body)
	if resp.StatusCode != 200 || !strings.HasPrefix(s, upstreamtest.SSE("Hel")[0]) || !strings.Contains(s, "continuing it failed") ||
		strings.Contains(s, "prefill is not supported") {
		t.Fatalf("%d: %q", resp.StatusCode, s)
	}
	if fallback.Count() != 1 {
		t.Fatalf("the fallback saw %d requests", fallback.Count())
	}
}

// TestAResponsesStreamIsNotContinued: the Responses API's events carry
// output items and sequence numbers a continuation cannot splice; a cut
// one ends with its error event as ever.
func TestAResponsesStreamIsNotContinued(t *testing.T) {
	t.Parallel()
	primary := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader},
		Chunks: []string{created, respDelta}, Fault: upstreamtest.Cut})
	fallback := upstreamtest.Start(t, sseStep(created, respDelta, respDone))
	h := startRescue(t, primary, fallback, upstream.ContinuePrefill, nil)
	resp, body := h.do("POST", "/v1/responses", `{"model":"m","stream":true,"input":"hi"}`, "Content-Type", "application/json")
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"code":"stream_interrupted"`) || fallback.Count() != 0 {
		t.Fatalf("%d, fallback saw %d: %q", resp.StatusCode, fallback.Count(), body)
	}
}

// TestACutMidEventLeavesNoFragmentAtTheSeam: a stream cut inside an
// event (part-way into its JSON, or just before its blank line) never
// hands that fragment to the client, glued to the continuation or not:
// the continuation starts after the last whole event.
func TestACutMidEventLeavesNoFragmentAtTheSeam(t *testing.T) {
	t.Parallel()
	for _, cut := range []int{40, len(upstreamtest.SSE("lo")[0]) - 1} {
		ch := upstreamtest.SSE("Hel", "lo")
		first := sseStep(ch[0], ch[1][:cut])
		first.Fault = upstreamtest.Stall
		primary := upstreamtest.Start(t, first)
		cont := continuationOf("lo", " world")
		cont.Chunks = cont.Chunks[1:] // a server that sends no role-only chunk
		fallback := upstreamtest.Start(t, cont)
		h := startRescue(t, primary, fallback, upstream.ContinuePrefill, nil)
		resp, body := h.chat(streamChat)
		want := ch[0] + strings.ReplaceAll(strings.Join(cont.Chunks, ""), `"id":"chatcmpl-2"`, `"id":"chatcmpl-1"`)
		if resp.StatusCode != 200 || string(body) != want {
			t.Errorf("cut at byte %d: %d:\n%q\nwant\n%q", cut, resp.StatusCode, body, want)
		}
		if got := gjson.GetBytes(fallback.Requests()[0].Body, "messages.@reverse.0.content").Str; got != "Hel" {
			t.Errorf("cut at byte %d: continued from %q, want the whole events' text only", cut, got)
		}
	}
}

// TestNothingIsRelayedAfterTheTerminator: an upstream that ends its
// stream (chat's [DONE], the Responses API's response.completed,
// Ollama's "done": true), keeps sending and is then cut: the client gets
// the stream up to its terminator's event, whole and clean, and no
// continuation is sent. Before, the events after [DONE] were relayed (two
// [DONE]s) and the cut was rescued, billing a second generation.
func TestNothingIsRelayedAfterTheTerminator(t *testing.T) {
	t.Parallel()
	chat := upstreamtest.SSE("Hel", "lo")
	ollama := []string{`{"message":{"content":"Hi"},"done":false}` + "\n", `{"message":{"content":""},"done":true}` + "\n"}
	for _, tt := range []struct {
		name, path string
		stream     []string
		header     [2]string
	}{
		{"chat", "/v1/chat/completions", chat, upstreamtest.SSEHeader},
		{"responses", "/v1/responses", []string{created, respDelta, respDone}, upstreamtest.SSEHeader},
		{"ollama", "/api/chat", ollama, [2]string{"Content-Type", "application/x-ndjson"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			after := append(append([]string{}, tt.stream...), chunkOf("chatcmpl-1", "junk"), "data: [DONE]\n\n")
			primary := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{tt.header}, Chunks: after, Fault: upstreamtest.Cut})
			fallback := upstreamtest.Start(t, continuationOf(" wor", "ld"))
			h := startRescue(t, primary, fallback, upstream.ContinuePrefill, nil)
			resp, body := h.do("POST", tt.path, streamChat, "Content-Type", "application/json")
			if want := strings.Join(tt.stream, ""); resp.StatusCode != 200 || string(body) != want {
				t.Fatalf("%d:\n%q\nwant\n%q", resp.StatusCode, body, want)
			}
			if n := fallback.Count(); n != 0 {
				t.Fatalf("a continuation was sent after the stream's terminator (%d requests)", n)
			}
			if line := h.accessLines(1)[0]; line["outcome"] != outcomeOK || line["rescue_refused"] != nil {
				t.Fatalf("logged %v", line)
			}
		})
	}
}

// TestAContinuationIsPaidForFromTheRetryBudget: a continuation is a second
// request for one answer, so it takes a retry from its upstream's budget
// like any retry: with one retry in the fallback's budget, the first cut
// stream is continued, the second is not (rescue_refused: budget) and
// ends with the interruption event.
func TestAContinuationIsPaidForFromTheRetryBudget(t *testing.T) {
	t.Parallel()
	primary := upstreamtest.Start(t, cutAfter(upstreamtest.Cut, "Hel", "lo"))
	cont := continuationOf(" wor", "ld")
	fallback := upstreamtest.Start(t, cont)
	h := startRescue(t, primary, fallback, upstream.ContinuePrefill, func(o *Options) {
		// One retry per 10 s window, whatever the first attempts.
		o.Upstreams[1].RetryBudget = upstream.RetryBudget{Ratio: 1e-9, MinPerSecond: 0.1}
	})
	want := strings.Join(upstreamtest.SSE("Hel", "lo")[:2], "") + relabelled(cont)
	if resp, body := h.chat(streamChat); resp.StatusCode != 200 || string(body) != want {
		t.Fatalf("the first: %d:\n%s", resp.StatusCode, body)
	}
	resp, body := h.chat(streamChat)
	if resp.StatusCode != 200 || !strings.HasPrefix(string(body), upstreamtest.SSE("Hel")[0]) ||
		!strings.Contains(string(body), "stream_interrupted") || strings.Contains(string(body), "wor") {
		t.Fatalf("the second: %d:\n%s", resp.StatusCode, body)
	}
	if fallback.Count() != 1 {
		t.Fatalf("the fallback saw %d requests, want 1", fallback.Count())
	}
	lines := h.accessLines(2)
	if lines[0]["rescued"] != 1.0 || lines[1]["rescue_refused"] != "budget" || lines[1]["rescued"] != 0.0 {
		t.Fatalf("access lines %v", lines)
	}
}

// TestAContinuationNotSentGivesItsRetryBack: a continuation whose body
// would pass max_body is never sent, and the retry reserved for it goes
// back to the budget: with one retry in the fallback's budget, the next
// cut stream is still continued.
func TestAContinuationNotSentGivesItsRetryBack(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 400) // the continuation's body would pass max_body
	primary := upstreamtest.Start(t, cutAfter(upstreamtest.Cut, "Hel", long), cutAfter(upstreamtest.Cut, "Hel", "lo"))
	cont := continuationOf(" wor", "ld")
	fallback := upstreamtest.Start(t, cont)
	h := startRescue(t, primary, fallback, upstream.ContinuePrefill, func(o *Options) {
		o.Upstreams[1].RetryBudget = upstream.RetryBudget{Ratio: 1e-9, MinPerSecond: 0.1} // one retry per 10 s
		o.Routes[0].MaxBody = 300
	})
	if resp, body := h.chat(streamChat); resp.StatusCode != 200 || !strings.Contains(string(body), "stream_interrupted") {
		t.Fatalf("the first: %d:\n%s", resp.StatusCode, body)
	}
	want := strings.Join(upstreamtest.SSE("Hel", "lo")[:2], "") + relabelled(cont)
	if resp, body := h.chat(streamChat); resp.StatusCode != 200 || string(body) != want {
		t.Fatalf("the second: %d:\n%s", resp.StatusCode, body)
	}
	lines := h.accessLines(2)
	if lines[0]["rescue_refused"] != "too_large" || lines[1]["rescued"] != 1.0 || fallback.Count() != 1 {
		t.Fatalf("fallback saw %d; access lines %v", fallback.Count(), lines)
	}
}

// TestAReadTimeoutIsNoTotal: the Python SDK's X-Stainless-Read-Timeout
// bounds the gaps between bytes — for Sturdy, the wait for a response
// head — not the request: a stream cut after it passed is still
// continued. Before, it was the request's whole budget, and the rescue
// was refused (stream_interrupted).
func TestAReadTimeoutIsNoTotal(t *testing.T) {
	t.Parallel()
	first := cutAfter(upstreamtest.Cut, "Hel", "lo")
	first.ChunkDelay = 1200 * time.Millisecond // cut 1.2 s in: past the client's 1 s
	primary := upstreamtest.Start(t, first)
	cont := continuationOf(" wor", "ld")
	fallback := upstreamtest.Start(t, cont)
	h := startRescue(t, primary, fallback, upstream.ContinuePrefill, func(o *Options) { o.Upstreams[0].Timeouts.Idle = 2 * time.Second })
	resp, body := h.chat(streamChat, "X-Stainless-Read-Timeout", "1", "X-Stainless-Lang", "python")
	want := strings.Join(upstreamtest.SSE("Hel", "lo")[:2], "") + relabelled(cont)
	if resp.StatusCode != 200 || string(body) != want {
		t.Fatalf("%d:\n%s\nwant\n%s", resp.StatusCode, body, want)
	}
}
