package proxy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"sturdy/internal/upstreamtest"
	"sturdy/upstream"
)

// TestShutdownEndsEveryWait puts a request into each kind of wait —
// backoff, Retry-After, cooldown, pacing, a max_in_flight slot — then
// shuts the proxy down: the wait ends at once, and the request gets its
// last upstream reply if it had one, else 503 shutting_down.
func TestShutdownEndsEveryWait(t *testing.T) {
	t.Parallel()
	long := 20 * time.Second
	slowRetry := func(o *Options) {
		o.Routes[0].Retry.BaseDelay, o.Routes[0].Retry.MaxDelay = long, long
		o.Routes[0].Deadline = time.Minute
	}
	tests := []struct {
		name   string
		steps  []upstreamtest.Step
		noUp   bool // nothing listens: every attempt fails to connect
		edit   func(*Options)
		prime  func(t *testing.T, h *harness, up *upstreamtest.Server) // requests that set the wait up
		status int
		code   string // "" for the upstream's own reply
	}{
		{name: "backoff with a reply", steps: []upstreamtest.Step{{Status: 503, Body: "busy"}}, edit: slowRetry, status: 503},
		{name: "backoff without a reply", noUp: true, edit: slowRetry, status: 503, code: CodeShuttingDown},
		{name: "retry-after", steps: []upstreamtest.Step{{Status: 429, Header: [][2]string{{"Retry-After", "15"}}, Body: "later"}},
			edit: func(o *Options) { o.Routes[0].Retry.MaxRetryAfter = time.Minute; o.Routes[0].Deadline = time.Minute }, status: 429},
		{name: "cooldown", steps: []upstreamtest.Step{{Status: 429, Header: [][2]string{{"Retry-After", "15"}}, Body: "later"}},
			edit: func(o *Options) {
				o.Routes[0].Retry.MaxAttempts = 1
				o.Routes[0].Retry.MaxRetryAfter = time.Minute
				o.Routes[0].Deadline = time.Minute
			},
			prime: func(_ *testing.T, h *harness, _ *upstreamtest.Server) { h.chat("") }, status: 503, code: CodeShuttingDown},
		{name: "pacing", steps: []upstreamtest.Step{{Body: "ok"}},
			edit: func(o *Options) {
				o.Upstreams[0].RateLimit = upstream.RateLimit{RequestsPerSecond: 0.05, Burst: 1, MaxWait: time.Minute}
				o.Routes[0].Deadline = time.Minute
			},
			prime: func(_ *testing.T, h *harness, _ *upstreamtest.Server) { h.chat("") }, status: 503, code: CodeShuttingDown},
		{name: "pacing on a fallback after a skipped primary", steps: []upstreamtest.Step{{Body: "ok"}},
			edit: func(o *Options) {
				withFallbacks(o, []string{o.Upstreams[0].URL})
				o.Upstreams[0].RateLimit = upstream.RateLimit{RequestsPerSecond: 0.05, Burst: 1, MaxWait: time.Millisecond}
				o.Upstreams[1].RateLimit = upstream.RateLimit{RequestsPerSecond: 0.05, Burst: 1, MaxWait: time.Minute}
				o.Routes[0].Deadline = time.Minute
			},
			prime: func(_ *testing.T, h *harness, _ *upstreamtest.Server) { h.chat(""); h.chat("") }, status: 503, code: CodeShuttingDown},
		{name: "max_in_flight slot", steps: []upstreamtest.Step{{Delay: 1500 * time.Millisecond, Body: "slow"}},
			edit: func(o *Options) { o.Upstreams[0].MaxInFlight = 1; o.Upstreams[0].QueueTimeout = long },
			// The slot is held once the upstream has the first request: a
			// fixed sleep let the test's own request win it on a loaded machine.
			prime: func(t *testing.T, h *harness, up *upstreamtest.Server) {
				go h.chat("")
				waitFor(t, 5*time.Second, "the first request holds the slot", func() bool { return up.Count() == 1 })
			}, status: 503, code: CodeShuttingDown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			url := "http://" + freePort(t)
			var up *upstreamtest.Server
			if !tt.noUp {
				up = upstreamtest.Start(t, tt.steps...)
				url = up.URL
			}
			h := startProxy(t, url, tt.edit)
			if tt.prime != nil {
				tt.prime(t, h, up)
			}
			type result struct {
				resp *http.Response
				body []byte
			}
			done := make(chan result, 1)
			go func() { resp, body := h.chat(""); done <- result{resp, body} }()
			time.Sleep(300 * time.Millisecond) // well into its wait
			stopped := time.Now()
			go func() { _ = h.p.Shutdown(context.Background()) }()
			var r result
			select {
			case r = <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("the wait did not end on shutdown")
			}
			if took := time.Since(stopped); took > time.Second {
				t.Errorf("answered %v after shutdown began", took)
			}
			// The upstream's last reply is final; Sturdy's own shutting_down
			// leaves the SDK free to retry elsewhere.
			wantShouldRetry := "false"
			if tt.code == CodeShuttingDown {
				wantShouldRetry = ""
			}
			if r.resp.StatusCode != tt.status || r.resp.Header.Get("X-Should-Retry") != wantShouldRetry {
				t.Fatalf("%d %q, x-should-retry %q; want %d", r.resp.StatusCode, r.body, r.resp.Header.Get("X-Should-Retry"), tt.status)
			}
			if tt.code != "" {
				if code, _ := errorOf(t, r.body); code != tt.code {
					t.Fatalf("code %s, want %s: %s", code, tt.code, r.body)
				}
			}
			lines := h.accessLines(1)
			last := lines[len(lines)-1]
			if tt.code == "" && last["stop"] != "shutting_down" {
				t.Fatalf("access line: %v", last)
			}
			if retries, _ := last["retries"].([]any); float64(len(retries)) != max(last["attempts"].(float64)-1, 0) {
				t.Fatalf("a retry that never happened is logged: %v", last)
			}
		})
	}
}

// TestStreamPastTheGraceEndsWithAnInterruptionEvent: a stream still open
// when Shutdown's grace ends gets a stream_interrupted event (no [DONE])
// and an access-log line, not a bare cut.
func TestStreamPastTheGraceEndsWithAnInterruptionEvent(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader},
		Chunks: upstreamtest.SSE(upstreamtest.Words(30, "tok")...), ChunkDelay: 100 * time.Millisecond})
	h := startProxy(t, up.URL, nil)
	resp, err := http.Post(h.url+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := h.p.Shutdown(ctx); err == nil {
		t.Fatal("the grace did not run out: the test proves nothing")
	}
	if ok, _ := h.p.Ready(); ok {
		t.Fatal("ready while shutting down")
	}
	body, _ := io.ReadAll(resp.Body)
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the stream outlived the grace by %v", took)
	}
	if !strings.Contains(string(body), `"code":"stream_interrupted"`) || strings.Contains(string(body), "[DONE]") ||
		!strings.Contains(string(body), "shutting down") {
		t.Fatalf("stream cut past the grace: %q", body)
	}
	if line := h.accessLines(1)[0]; line["outcome"] != "stream_interrupted" {
		t.Fatalf("access line: %v", line)
	}
}
