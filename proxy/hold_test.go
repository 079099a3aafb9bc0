package proxy

import (
	"strings"
	"testing"
	"time"

	"sturdy/internal/upstreamtest"
)

// cutAfter is a chat stream of words that fails (fault) after them,
// before its finish_reason and [DONE].
func cutAfter(fault upstreamtest.Fault, words ...string) upstreamtest.Step {
	chunks := upstreamtest.SSE(words...)
	return upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: chunks[:len(words)], Fault: fault}
}

const streamChat = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`

// TestStreamHoldRestartsAFailureInsideItsWindow: with stream_hold, a
// stream that fails inside the window — cut, stalled past idle, an
// in-band error — is retried from scratch and the client sees only the
// whole answer of the retry.
func TestStreamHoldRestartsAFailureInsideItsWindow(t *testing.T) {
	t.Parallel()
	whole := sseStep(upstreamtest.SSE("Hello", " world")...)
	inBand := sseStep(append(upstreamtest.SSE("Hel")[:1], vllmError)...)
	for _, tt := range []struct {
		name  string
		first upstreamtest.Step
	}{
		{"cut", cutAfter(upstreamtest.Cut, "Hel")},
		{"stalled past idle", cutAfter(upstreamtest.Stall, "Hel")},
		{"in-band error", inBand},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			up := upstreamtest.Start(t, tt.first, whole)
			h := startProxy(t, up.URL, func(o *Options) {
				o.Upstreams[0].Timeouts.Idle = 300 * time.Millisecond
				o.Routes[0].StreamHold = StreamHold{Max: 5 * time.Second, Bytes: 64 << 10}
			})
			resp, body := h.chat(streamChat)
			if want := strings.Join(whole.Chunks, ""); resp.StatusCode != 200 || string(body) != want {
				t.Fatalf("%d: %q\nwant %q", resp.StatusCode, body, want)
			}
			if resp.Header.Get("X-Sturdy-Attempts") != "2" || up.Count() != 2 {
				t.Fatalf("attempts %s, upstream saw %d", resp.Header.Get("X-Sturdy-Attempts"), up.Count())
			}
			if line := h.accessLines(1)[0]; line["outcome"] != "ok" || line["attempts"] != 2.0 {
				t.Fatalf("access line %v", line)
			}
		})
	}
}

// TestPastTheHoldWindowTheStreamFlows: once the window passes — by time
// or by bytes — the stream is the client's, and a later failure ends it
// with the interruption event as without a hold.
func TestPastTheHoldWindowTheStreamFlows(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		hold StreamHold
	}{
		{"by bytes", StreamHold{Max: 10 * time.Second, Bytes: 100}},
		{"by time", StreamHold{Max: 100 * time.Millisecond, Bytes: 1 << 20}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			first := cutAfter(upstreamtest.Cut, "Hello", " there", " friend")
			first.ChunkDelay = 250 * time.Millisecond
			up := upstreamtest.Start(t, first, sseStep(upstreamtest.SSE("again")...))
			h := startProxy(t, up.URL, func(o *Options) { o.Routes[0].StreamHold = tt.hold })
			resp, body := h.chat(streamChat)
			s := string(body)
			if resp.StatusCode != 200 || !strings.HasPrefix(s, strings.Join(first.Chunks, "")) ||
				!strings.Contains(s, `"code":"stream_interrupted"`) || strings.Contains(s, "again") {
				t.Fatalf("%d: %q", resp.StatusCode, s)
			}
			if up.Count() != 1 {
				t.Fatalf("a stream past its window was restarted: the upstream saw %d", up.Count())
			}
		})
	}
}

// TestStreamHoldSendsAWholeShortStreamAtOnce: a stream that ends inside
// the window goes out whole, as the upstream sent it.
func TestStreamHoldSendsAWholeShortStreamAtOnce(t *testing.T) {
	t.Parallel()
	whole := sseStep(upstreamtest.SSE("Hello", " world")...)
	up := upstreamtest.Start(t, whole)
	h := startProxy(t, up.URL, func(o *Options) { o.Routes[0].StreamHold = StreamHold{Max: 2 * time.Second, Bytes: 64 << 10} })
	start := time.Now()
	resp, body := h.chat(streamChat)
	if resp.StatusCode != 200 || string(body) != strings.Join(whole.Chunks, "") || up.Count() != 1 {
		t.Fatalf("%d: %q", resp.StatusCode, body)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("a stream that ended was held %v: its end must end the window", took)
	}
}
