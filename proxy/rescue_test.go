package proxy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"sturdy/internal/upstreamtest"
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
func startRescue(t *testing.T, primary, fallback *upstreamtest.Server, c Continuation, edit func(*Options)) *harness {
	return startProxy(t, primary.URL, func(o *Options) {
		o.Upstreams[0].IdleTimeout = 300 * time.Millisecond
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
	for _, tt := range []struct {
		name  string
		first upstreamtest.Step
		c     Continuation
	}{
		{"cut, prefill", cutAfter(upstreamtest.Cut, "Hel", "lo"), ContinuePrefill},
		{"stalled past idle, vllm", cutAfter(upstreamtest.Stall, "Hel", "lo"), ContinueVLLM},
		{"in-band error", sseStep(append(upstreamtest.SSE("Hel", "lo")[:2], vllmError)...), ContinuePrefill},
	} {
		t.Run(tt.name, func(t *testing.T) {
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
			if vllm != (tt.c == ContinueVLLM) || (tt.c == ContinuePrefill && sent.Get("continue_final_message").Exists()) {
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
