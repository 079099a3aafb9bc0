package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/valyala/fasthttp"

	"sturdy/breaker"
	"sturdy/internal/otlptest"
	"sturdy/internal/upstreamtest"
)

// staleAttempts is the attempts metric of up's stale connections.
func (h *harness) staleAttempts() float64 {
	var m dto.Metric
	if err := h.p.m.Attempts.WithLabelValues("up", h.p.tbl.Load().upstreams[0].Endpoints()[0].Addr(), "stale").Write(&m); err != nil {
		h.t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// The three tests of a stale connection (not TestAConnectionThatDies…,
// whose connection dies 300 ms late) are not parallel: a connection is
// stale when it dies within two round trips and 10 ms of the request
// being written, which the load of other tests can stretch.

func TestStaleKeepAliveConnectionIsCountedButNotAFailure(t *testing.T) {
	// The raw chunked reply closes its connection without saying so: the
	// next request finds a dead pooled connection.
	up := upstreamtest.Start(t, upstreamtest.Step{Chunks: []string{"ok"}, SilentClose: true})
	h := startProxy(t, up.URL, func(o *Options) {
		o.Routes[0].Retry.MaxAttempts = 2
		o.Upstreams[0].Breaker = breaker.Settings{ConsecutiveFailures: 1, MinRequests: 1000}
	})
	for i := 0; i < 3; i++ {
		time.Sleep(60 * time.Millisecond) // let the upstream close it
		resp, body := h.chat("")
		want := "2" // the stale attempt, then the resend on a fresh connection
		if i == 0 {
			want = "1"
		}
		if resp.StatusCode != 200 || string(body) != "ok" || resp.Header.Get("X-Sturdy-Attempts") != want {
			t.Fatalf("request %d: %d %q, x-sturdy-attempts %q, want %s", i, resp.StatusCode, body, resp.Header.Get("X-Sturdy-Attempts"), want)
		}
	}
	if st := h.p.tbl.Load().upstreams[0].Endpoints()[0].Breaker().State(); st != breaker.StateClosed {
		t.Fatalf("stale connections counted against the breaker: %v", st)
	}
	if n := h.staleAttempts(); n != 2 {
		t.Fatalf("attempts{result=stale} = %v, want 2", n)
	}
	// Of the five attempts only the first request's counts for an adaptive
	// limit: a stale connection's attempt was not sent, its replay's time
	// says nothing of the load.
	ep := h.p.tbl.Load().upstreams[0].Endpoints()[0]
	released(t, ep)
	if n, _ := ep.Samples(); n != 1 {
		t.Fatalf("%d samples count, want 1 (stale attempts and their replays do not)", n)
	}
	lines := h.accessLines(3)
	if lines[2]["attempts"] != 2.0 || len(lines[2]["retries"].([]any)) != 1 {
		t.Fatalf("access line does not show the resend: %v", lines[2])
	}
}

// TestStaleResendIsReportedAsTheUpstreamSawIt: an upstream that reads a
// request on a reused connection and resets it looks stale, but it did
// receive the request. Every request the upstream received must show up
// in x-sturdy-attempts, the log and the metrics.
func TestStaleResendIsReportedAsTheUpstreamSawIt(t *testing.T) {
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "first"}, upstreamtest.Step{Fault: upstreamtest.Reset},
		upstreamtest.Step{Body: "second"})
	h := startProxy(t, up.URL, nil)
	reported := 0
	for _, want := range []string{"first", "second"} {
		resp, body := h.chat("")
		if resp.StatusCode != 200 || string(body) != want {
			t.Fatalf("%d %q, want %q", resp.StatusCode, body, want)
		}
		n, err := strconv.Atoi(resp.Header.Get("X-Sturdy-Attempts"))
		if err != nil {
			t.Fatal(err)
		}
		reported += n
	}
	if up.Count() != 3 || reported != 3 || h.staleAttempts() != 1 {
		t.Fatalf("upstream received %d requests, Sturdy reported %d attempts (%v stale)", up.Count(), reported, h.staleAttempts())
	}
}

// TestAStaleResendTakesNoAttempt: with max_attempts 1 (and
// max_total_attempts 1) a stale pooled connection is still resent at
// once — the resend is reported (x-sturdy-attempts 2) but counted by no
// budget, so it never takes the attempt another target needs. Before, a
// stale connection used up max_total_attempts and the request got 502.
func TestAStaleResendTakesNoAttempt(t *testing.T) {
	up := upstreamtest.Start(t, upstreamtest.Step{Chunks: []string{"ok"}, SilentClose: true})
	h := startProxy(t, up.URL, func(o *Options) {
		o.Routes[0].Retry.MaxAttempts = 1 // one send, and no more
		o.Upstreams[0].Breaker = breaker.Settings{ConsecutiveFailures: 1, MinRequests: 1000}
	})
	h.chat("")
	time.Sleep(60 * time.Millisecond)
	resp, body := h.chat("")
	if resp.StatusCode != 200 || string(body) != "ok" || resp.Header.Get("X-Sturdy-Attempts") != "2" || up.Count() != 2 {
		t.Fatalf("%d %s, x-sturdy-attempts %q, upstream saw %d", resp.StatusCode, body, resp.Header.Get("X-Sturdy-Attempts"), up.Count())
	}
	if st := h.p.tbl.Load().upstreams[0].Endpoints()[0].Breaker().State(); st != breaker.StateClosed {
		t.Fatalf("a stale connection counted against the breaker: %v", st)
	}
}

// TestAConnectionThatDiesAfterWorkIsAResetNotStale: an upstream that
// reads the request on a reused connection, works on it, then dies may
// have processed it: no immediate resend, but a retry counted like any
// reset (backoff, breaker), so the upstream receives no more requests
// than attempts allow.
func TestAConnectionThatDiesAfterWorkIsAResetNotStale(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "first"}, upstreamtest.Step{Delay: 300 * time.Millisecond, Fault: upstreamtest.Reset},
		upstreamtest.Step{Body: "second"})
	h := startProxy(t, up.URL, nil)
	h.chat("")
	resp, body := h.chat("")
	if resp.StatusCode != 200 || string(body) != "second" || resp.Header.Get("X-Sturdy-Attempts") != "2" {
		t.Fatalf("%d %q attempts %s", resp.StatusCode, body, resp.Header.Get("X-Sturdy-Attempts"))
	}
	if h.staleAttempts() != 0 {
		t.Fatal("a connection that died after 300 ms of work was taken for stale")
	}
	line := h.accessLines(2)[1]
	if r := line["retries"].([]any)[0].(map[string]any); r["reason"] != "reset" {
		t.Fatalf("retry reason %v, want reset", r["reason"])
	}
}

// TestAStaleReplayIsMarkedInItsSpan: the attempt that resends a request
// after a stale pooled connection carries sturdy.stale_replay (it was
// never set: the flag was read after the attempt had cleared it).
func TestAStaleReplayIsMarkedInItsSpan(t *testing.T) {
	rcv := otlptest.Start(t)
	up := upstreamtest.Start(t, upstreamtest.Step{Chunks: []string{"ok"}, SilentClose: true})
	h := startProxy(t, up.URL, func(o *Options) { withTracing(t, o, rcv, 1) })
	h.chat("")
	time.Sleep(60 * time.Millisecond) // let the upstream close it
	const trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	if resp, _ := h.chat("", "traceparent", trace); resp.Header.Get("X-Sturdy-Attempts") != "2" {
		t.Fatalf("the pooled connection was not found stale: x-sturdy-attempts %q", resp.Header.Get("X-Sturdy-Attempts"))
	}
	_, attempts := serverSpan(t, rcv, "0af7651916cd43dd8448eb211c80319c", 2)
	if len(attempts) != 2 || attempts[0].Attrs["sturdy.stale_replay"] != nil || attempts[1].Attrs["sturdy.stale_replay"] != true {
		t.Fatalf("the attempts' stale_replay: %v, %v", attempts[0].Attrs["sturdy.stale_replay"], attempts[1].Attrs["sturdy.stale_replay"])
	}
}

// TestAClientLeavingAtTheTerminatorBreaksNoLaterRequest: a client that
// closes its connection as soon as it has read a stream's data: [DONE]
// (httpx's stream context, many agent loops) leaves no closed connection
// in the pool: 1,000 rounds, each followed by a request with one attempt,
// and none fails. Before, the client's leaving closed the connection,
// the body's close then pooled it, and the next request failed at once
// as a reset, never sent (5–15 of 200 follow-ups).
func TestAClientLeavingAtTheTerminatorBreaksNoLaterRequest(t *testing.T) {
	t.Parallel()
	stream := upstreamtest.SSE(upstreamtest.Words(3, "tok ")...)
	url := upstreamtest.Serve(t, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if bytes.Contains(ctx.Request.Body(), []byte(`"stream":true`)) {
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				for _, ev := range stream {
					_, _ = w.WriteString(ev)
					_ = w.Flush()
				}
			})
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyString(upstreamtest.ChatCompletion("ok"))
	}})
	h := startProxy(t, url, func(o *Options) { o.Routes[0].Retry.MaxAttempts = 1 })
	addr := strings.TrimPrefix(h.url, "http://")
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(streamBody)) + "\r\n\r\n" + streamBody
	failed := 0
	for round := 0; round < 1000; round++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		var got []byte
		buf := make([]byte, 4096)
		for !bytes.Contains(got, []byte("data: [DONE]")) {
			if len(got) >= 12 && !bytes.HasPrefix(got, []byte("HTTP/1.1 200")) {
				break // the stream itself failed: counted below
			}
			n, err := c.Read(buf)
			if err != nil {
				t.Fatalf("round %d: %v after %q", round, err, got)
			}
			got = append(got, buf[:n]...)
		}
		c.Close() // at once, as the terminator arrives
		if !bytes.HasPrefix(got, []byte("HTTP/1.1 200")) {
			failed++
			t.Logf("round %d: the stream got %.60q", round, got)
		}
		if resp, body := h.chat(""); resp.StatusCode != 200 {
			failed++
			t.Logf("round %d: the follow-up got %d %s", round, resp.StatusCode, body)
		}
	}
	if failed > 0 {
		t.Fatalf("%d of 1,000 rounds failed", failed)
	}
}
