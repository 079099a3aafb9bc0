package proxy

import (
	"strings"
	"testing"

	"sturdy/internal/upstreamtest"
)

// A stream cut in the middle of an event: the partial event must not reach
// the client glued to the continuation's first event.
func TestZZPartialEventAtSeam(t *testing.T) {
	for _, cut := range []int{40, len(upstreamtest.SSE("lo")[0]) - 1} {
		ch := upstreamtest.SSE("Hel", "lo")
		partial := ch[1][:cut]
		first := sseStep(ch[0], partial)
		first.Fault = upstreamtest.Stall
		primary := upstreamtest.Start(t, first)
		cont := continuationOf("lo", " world")
		cont.Chunks = cont.Chunks[1:] // no role-only chunk
		fallback := upstreamtest.Start(t, cont)
		h := startRescue(t, primary, fallback, ContinuePrefill, nil)
		resp, body := h.chat(streamChat)
		want := ch[0] + strings.ReplaceAll(strings.Join(cont.Chunks, ""), `"id":"chatcmpl-2"`, `"id":"chatcmpl-1"`)
		if resp.StatusCode != 200 || string(body) != want {
			t.Errorf("cut %d: %d:\n%q\nwant\n%q", cut, resp.StatusCode, body, want)
		}
	}
}
