package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"sturdy/breaker"
	"sturdy/internal/upstreamtest"
	"sturdy/policy"
	"sturdy/tracing"
	"sturdy/units"
	"sturdy/upstream"
)

// These tests hold Sturdy's bounds against hostile input: what a client
// or an upstream sends must not grow memory or time without bound. They
// measure the heap after GC (not RSS, which -race inflates) and do not
// run in parallel, so other tests' allocations stay out of the figures.

// forgetfulUpstream serves handler on loopback and, unlike upstreamtest's
// scripted server, keeps no copy of the requests it receives.
func forgetfulUpstream(t *testing.T, handler fasthttp.RequestHandler) string {
	t.Helper()
	return upstreamtest.Serve(t, &fasthttp.Server{Handler: handler, Logger: upstreamtest.Quiet{}, MaxRequestBodySize: 64 << 20, ReadBufferSize: 64 << 10,
		NoDefaultServerHeader: true, NoDefaultDate: true})
}

// hugeModelBody is a chat request whose model is n bytes, distinct per i.
func hugeModelBody(i, n int) string {
	return fmt.Sprintf(`{"model":"%d-%s","messages":[{"role":"user","content":"hi"}]}`, i, strings.Repeat("m", n))
}

// TestHugeModelNamesAreKeptBounded: distinct 1 MiB model names, each
// failing (so each opens a reply breaker and logs it), keep no copy of
// themselves: a breaker is keyed by policy.ModelKey (at most 256 bytes),
// /debug/upstreams, the log and the circuit_open body show that key.
// Before, each model was kept twice per breaker (its key and the
// breaker's name): 40 of them held 80 MiB.
func TestHugeModelNamesAreKeptBounded(t *testing.T) {
	url := forgetfulUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(500)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"boom"}}`)
	})
	h := startProxy(t, url, func(o *Options) {
		o.Routes[0].MaxBody = 2 << 20
		o.Routes[0].Retry.MaxAttempts = 1
		o.Upstreams[0].Breaker = breaker.Settings{ConsecutiveFailures: 1, MinRequests: 1000, OpenFor: time.Minute}
	})
	const models, size = 40, 1 << 20
	h.chat(hugeModelBody(-1, size)) // warm the pools: buffers for a body this size
	before := heapInUse()
	for i := 0; i < models; i++ {
		if resp, _ := h.chat(hugeModelBody(i, size)); resp.StatusCode != 500 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	if grown := int64(heapInUse()) - int64(before); grown > 8<<20 {
		t.Fatalf("%d distinct 1 MiB models retained %d MiB after GC", models, grown>>20)
	}
	// The same model again finds its open breaker: the body names it by key.
	resp, body := h.chat(hugeModelBody(3, size))
	if code, _ := errorOf(t, body); resp.StatusCode != 503 || code != CodeCircuitOpen || len(body) > 2048 {
		t.Fatalf("the open breaker of a long model: %d, %d bytes: %.300s", resp.StatusCode, len(body), body)
	}
	st, err := json.Marshal(h.p.Upstreams())
	if err != nil {
		t.Fatal(err)
	}
	if len(st) > 64<<10 {
		t.Fatalf("/debug/upstreams is %d KiB for %d models", len(st)>>10, models)
	}
	mbs := h.p.Upstreams()[0].ModelBreakers
	if len(mbs) < models {
		t.Fatalf("%d model breakers listed, want %d", len(mbs), models+1)
	}
	for _, m := range mbs {
		if len(m.Model) > policy.MaxModelBytes || !strings.Contains(m.Model, "…") {
			t.Fatalf("a model breaker shown as %d bytes: %.80q", len(m.Model), m.Model)
		}
	}
	for _, line := range strings.Split(h.logs.String(), "\n") {
		if len(line) > 8<<10 {
			t.Fatalf("a log line of %d KiB: %.200s", len(line)>>10, line)
		}
	}
	if !strings.Contains(h.logs.String(), `"model breaker state change"`) {
		t.Fatal("no model breaker opened: the test proves nothing")
	}
}

// TestTracingKeepsNoCopyOfAHugeModel: with tracing on and the collector
// down, spans wait in the export queue (2,048 of them); a 1 MiB model
// (and a long path and user agent) must not ride on each. Before, the
// model was cloned whole onto every request's spans: 40 requests held
// 40 MiB.
func TestTracingKeepsNoCopyOfAHugeModel(t *testing.T) {
	url := forgetfulUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(upstreamtest.ChatCompletion("ok"))
	})
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "600000") // the spans stay queued
	h := startProxy(t, url, func(o *Options) {
		o.Routes[0].MaxBody = 2 << 20
		o.Tracing = &Tracing{Settings: tracing.Settings{URL: "http://" + freePort(t) + "/v1/traces", Protocol: tracing.ProtocolHTTP,
			SampleRatio: 1, ServiceName: "s"}}
	})
	const requests, size = 40, 1 << 20
	ua := strings.Repeat("u", 8<<10)
	h.chat(hugeModelBody(-1, size), "User-Agent", ua)
	before := heapInUse()
	for i := 0; i < requests; i++ {
		if resp, _ := h.chat(hugeModelBody(i, size), "User-Agent", ua); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	if grown := int64(heapInUse()) - int64(before); grown > 8<<20 {
		t.Fatalf("%d traced requests with a 1 MiB model retained %d MiB after GC", requests, grown>>20)
	}
}

func TestSpanTextIsBounded(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"", "POST", strings.Repeat("a", maxSpanText), strings.Repeat("é", maxSpanText)} {
		out := spanText([]byte(in))
		if len(out) > maxSpanText || !utf8.ValidString(out) || (len(in) <= maxSpanText && out != in) {
			t.Errorf("spanText of %d bytes: %d bytes, valid %v", len(in), len(out), utf8.ValidString(out))
		}
	}
}

// TestTrailersAreReadBoundedAndDropped: a valid chunked reply with chunk
// extensions and a trailer section (Set-Cookie among its fields) is
// relayed whole — the trailers read and dropped — while a trailer
// section past 8 KiB fails the body (here before commit: retried, then
// 502) instead of being read on. Before,
// fasthttp's trailer reader refused Set-Cookie and the good reply became
// 502 retries_exhausted.
func TestTrailersAreReadBoundedAndDropped(t *testing.T) {
	t.Parallel()
	const head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nTrailer: Set-Cookie, X-Checksum\r\n\r\n"
	good := head + "5;name=value\r\n{\"a\":\r\n3;x=\"q;\"\r\n 1}\r\n0;last\r\nSet-Cookie: id=1; Path=/\r\nX-Checksum: abc\r\n\r\n"
	h := startProxy(t, upstreamtest.StartRaw(t, good), nil)
	resp, body := h.do("GET", "/v1/models", "")
	if resp.StatusCode != 200 || string(body) != `{"a": 1}` || resp.Header.Get("Set-Cookie") != "" || resp.Trailer.Get("X-Checksum") != "" {
		t.Fatalf("%d %q header %v trailer %v", resp.StatusCode, body, resp.Header, resp.Trailer)
	}

	huge := head + "5\r\n{\"a\":\r\n3\r\n 1}\r\n0\r\nX-Big: " + strings.Repeat("b", 16<<10) + "\r\n\r\n"
	h = startProxy(t, upstreamtest.StartRaw(t, huge), nil)
	req, _ := http.NewRequest("GET", h.url+"/v1/models", nil)
	r, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err == nil && r.StatusCode == 200 {
		t.Fatalf("a body whose trailer passes 8 KiB was presented as whole: %q", b)
	}
}

// gatedStream is an upstream that answers each request with a chunked
// stream (SSE unless contentType says otherwise) of chunks, then waits
// for gate to close and cuts the connection: a stream that fails
// mid-answer at the test's moment.
func gatedStream(t *testing.T, contentType string, chunks []string, gate <-chan struct{}) string {
	t.Helper()
	return "http://" + upstreamtest.ServeConns(t, func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		w := bufio.NewWriterSize(c, 64<<10)
		fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n\r\n", contentType)
		for _, ch := range chunks {
			fmt.Fprintf(w, "%x\r\n%s\r\n", len(ch), ch)
		}
		if w.Flush() != nil {
			return
		}
		select {
		case <-gate:
		case <-time.After(20 * time.Second):
		}
	})
}

// words is n chat chunks of a 4 KiB word each.
func words(n int) []string {
	return upstreamtest.SSE(upstreamtest.Words(n, strings.Repeat("w", 4<<10))...)[:n]
}

// readStream reads a response body in the background, counting its
// bytes; done gets its last 64 KiB once it ends (keeping all of it would
// weigh in the heap the tests measure).
func readStream(t *testing.T, h *harness, path, body string) (read *atomic.Int64, done <-chan string) {
	t.Helper()
	read = &atomic.Int64{}
	out := make(chan string, 1)
	req, _ := http.NewRequest("POST", h.url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer resp.Body.Close()
		var tail []byte
		buf := make([]byte, 64<<10)
		for {
			n, err := resp.Body.Read(buf)
			tail = append(tail, buf[:n]...)
			tail = tail[max(0, len(tail)-64<<10):]
			read.Add(int64(n))
			if err != nil {
				out <- string(tail)
				return
			}
		}
	}()
	return read, out
}

// TestRescueKeepsAtMostMaxRescueBytes: a rescuable stream of 16 MiB keeps
// at most max_rescue_bytes (1 MiB) of its text; past it the stream is
// relayed as ever, and when it is then cut it ends with its error event
// — no continuation, logged rescue_refused: too_large. Before, the whole
// answer was kept (2.7 GB for a stream without end) and sent as one
// continuation body past max_body.
func TestRescueKeepsAtMostMaxRescueBytes(t *testing.T) {
	gate := make(chan struct{})
	const n = 4096 // × 4 KiB = 16 MiB
	primary := upstreamtest.Server{URL: gatedStream(t, "text/event-stream", words(n), gate)}
	fallback := upstreamtest.Start(t, continuationOf(" wor", "ld"))
	h := startRescue(t, &primary, fallback, upstream.ContinuePrefill, func(o *Options) { o.Upstreams[0].Timeouts.Idle = 10 * time.Second })
	before := heapInUse()
	read, done := readStream(t, h, "/v1/chat/completions", streamChat)
	waitFor(t, 10*time.Second, "16 MiB relayed", func() bool { return read.Load() >= n*4<<10 })
	grown := int64(heapInUse()) - int64(before)
	close(gate)
	body := <-done
	if grown > 8<<20 {
		t.Fatalf("a 16 MiB rescuable stream held %d MiB", grown>>20)
	}
	if !strings.Contains(body, `"code":"stream_interrupted"`) || fallback.Count() != 0 {
		t.Fatalf("the cut stream: %d continuations, ends %q", fallback.Count(), body[max(0, len(body)-300):])
	}
	if line := h.accessLines(1)[0]; line["rescue_refused"] != policy.RescueTooLarge {
		t.Fatalf("logged %v", line)
	}
}

// TestAContinuationIsNeverLargerThanMaxBody: text within
// max_rescue_bytes whose continuation body would pass the route's
// max_body is not sent; the stream ends with its error event.
func TestAContinuationIsNeverLargerThanMaxBody(t *testing.T) {
	t.Parallel()
	primary := upstreamtest.Start(t, cutAfter(upstreamtest.Cut, upstreamtest.Words(4, strings.Repeat("w", 4<<10))...))
	fallback := upstreamtest.Start(t, continuationOf(" wor", "ld"))
	h := startRescue(t, primary, fallback, upstream.ContinuePrefill, func(o *Options) { o.Routes[0].MaxBody = 8 << 10 })
	_, body := h.chat(streamChat)
	if !strings.Contains(string(body), `"code":"stream_interrupted"`) || fallback.Count() != 0 {
		t.Fatalf("%d continuations sent past max_body; body ends %q", fallback.Count(), body[max(0, len(body)-200):])
	}
	if !strings.Contains(string(body), `from upstream \"up\"`) {
		t.Fatalf("the interruption names another upstream than the one that failed: %q", body[max(0, len(body)-300):])
	}
	if line := h.accessLines(1)[0]; line["rescue_refused"] != policy.RescueTooLarge || line["upstream"] != "up" || len(line["targets"].([]any)) != 1 {
		t.Fatalf("logged %v", line)
	}
}

// http10 asks path of h over HTTP/1.0 and returns the raw response.
func http10(t *testing.T, h *harness, path, body string) string {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST %s HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, len(body), body)
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	raw, err := io.ReadAll(conn)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// TestHTTP10BodiesAreBoundedAndSayWhy: a body of unknown length read
// whole for an HTTP/1.0 client is bounded by 64 MiB and by
// server.max_buffered_bytes; past either the client gets 502
// response_too_large naming the bound, and the budget is given back.
// Before, twelve such clients held 64 MiB each and past 64 MiB got 502
// upstream_unreachable, which named no cause.
func TestHTTP10BodiesAreBoundedAndSayWhy(t *testing.T) {
	t.Parallel()
	block := strings.Repeat("x", 1<<20)
	for _, tt := range []struct {
		name   string
		blocks int
		budget int64
		says   string
	}{
		{"past the budget", 4, 1 << 20, "server.max_buffered_bytes"},
		{"past 64 MiB", 65, 0, "64 MiB per response"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			url := forgetfulUpstream(t, func(ctx *fasthttp.RequestCtx) {
				ctx.SetContentType("application/octet-stream")
				ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
					for i := 0; i < tt.blocks; i++ {
						_, _ = w.WriteString(block)
						_ = w.Flush()
					}
				})
			})
			h := startProxy(t, url, func(o *Options) { o.Server.MaxBufferedBytes = tt.budget })
			raw := http10(t, h, "/v1/files/x/content", "{}")
			head, body, _ := strings.Cut(raw, "\r\n\r\n")
			if code, _ := errorOf(t, []byte(body)); !strings.HasPrefix(head, "HTTP/1.1 502") || code != CodeResponseTooLarge ||
				!strings.Contains(body, tt.says) {
				t.Fatalf("%.200s", raw)
			}
			waitFor(t, 5*time.Second, "the budget given back", func() bool { return h.p.held.used.Load() == 0 })
		})
	}
}

// heldStreamProxy is Sturdy (server.max_buffered_bytes budget, unless
// 0) holding up to holdBytes of an SSE stream for 10 s, in front of an
// upstream that sends n 4 KiB words, then nothing until the test ends.
func heldStreamProxy(t *testing.T, n int, holdBytes units.Size, budget int64) *harness {
	gate := make(chan struct{})
	url := gatedStream(t, "text/event-stream", words(n), gate)
	h := startProxy(t, url, func(o *Options) {
		o.Routes[0].StreamHold = StreamHold{Max: 10 * time.Second, Bytes: holdBytes}
		o.Upstreams[0].Timeouts.Idle = 15 * time.Second
		if budget > 0 {
			o.Server.MaxBufferedBytes = budget
		}
	})
	t.Cleanup(func() { close(gate) }) // first: the stream ends before Sturdy shuts down
	return h
}

// TestAHoldIsReleasedWhenTheBufferBudgetIsFull: a stream_hold window of
// 16 MiB and 10 s, a budget of 1 MiB: past the budget the head is no
// longer held and the stream flows at once. Before, each held stream
// could hold its 16 MiB, whatever the others held.
func TestAHoldIsReleasedWhenTheBufferBudgetIsFull(t *testing.T) {
	t.Parallel()
	h := heldStreamProxy(t, 512, 16<<20, 1<<20) // 2 MiB, then silence
	start := time.Now()
	read, _ := readStream(t, h, "/v1/chat/completions", streamChat) // returns once the head came
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the head was held %v: the budget did not end the hold", d)
	}
	waitFor(t, 5*time.Second, "the held stream flowing", func() bool { return read.Load() >= 1<<20 })
}

// TestAStreamGivesBackItsHeldHeadOnceItsClientHasIt: a stream held past
// its first chunk (stream_hold: 64 KiB of its 128 KiB of events, then
// silence) reserves its head's growth from server.max_buffered_bytes; once the
// client has the held bytes the head goes back to its pool and the
// reservation with it, while the stream stays open. Before, the
// reservation stayed for the stream's life, and the next request to take
// the same head from the pool reserved it a second time.
func TestAStreamGivesBackItsHeldHeadOnceItsClientHasIt(t *testing.T) {
	t.Parallel()
	h := heldStreamProxy(t, 32, 64<<10, 0) // 128 KiB, then silence
	read, done := readStream(t, h, "/v1/chat/completions", streamChat)
	waitFor(t, 5*time.Second, "the held head at the client", func() bool { return read.Load() >= 128<<10 })
	waitFor(t, 5*time.Second, "the head's reservation given back", func() bool { return h.p.held.used.Load() == 0 })
	select {
	case tail := <-done:
		t.Fatalf("the stream ended before its upstream did: %.200q", tail)
	default:
	}
}

// TestARequestThatLoopsBackIs508AtOnce: an upstream whose url is Sturdy's
// own listener answers 508 loop_detected to the request that came back
// (its Via names this process), and the first Sturdy hands that back
// without a retry; two different Sturdys in a chain pass the request on.
// Before, one request became 513 requests in flight holding every
// upstream connection, and its client got nothing for a minute.
func TestARequestThatLoopsBackIs508AtOnce(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	self := "http://" + ln.Addr().String()
	p, err := New(Options{Upstreams: []upstream.Options{testUpstream("self", self)}, Routes: []Route{testRoute("self")},
		Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.Serve(ln) }()
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	h := &harness{t: t, p: p, url: self, logs: &upstreamtest.LogBuffer{}}
	start := time.Now()
	resp, body := h.chat("")
	if code, _ := errorOf(t, body); resp.StatusCode != 508 || code != CodeLoopDetected || time.Since(start) > 2*time.Second {
		t.Fatalf("%d after %v: %s", resp.StatusCode, time.Since(start), body)
	}
	if n := resp.Header.Get("X-Sturdy-Attempts"); n != "" { // a pass-through of one attempt has none
		t.Fatalf("x-sturdy-attempts %q: the loop's 508 was retried", n)
	}

	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	shared := startProxy(t, up.URL, nil)
	sidecar := startProxy(t, shared.url, nil)
	if resp, body := sidecar.chat(""); resp.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("a chain of two Sturdys: %d %s", resp.StatusCode, body)
	}
	if via := up.Requests()[0].Raw; strings.Count(via, "sturdy-") != 2 {
		t.Fatalf("the upstream's request does not name both hops in Via: %q", via)
	}
}

// TestDiscoveryLeavesOutSturdysOwnListener: DNS that names Sturdy's own
// address on its listen port (a headless service that selects Sturdy's
// pod too) gives an endpoint that is left out, with one warning; the
// others serve.
func TestDiscoveryLeavesOutSturdysOwnListener(t *testing.T) {
	t.Parallel()
	v4 := startReplica(t, "")
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(v4.url, "http://"))
	self := "127.0.0.2:" + port
	h := startProxy(t, "", func(o *Options) {
		u := &o.Upstreams[0]
		u.URL = ""
		u.Discover = upstream.Discover{DNS: "models.internal:" + port, Scheme: "http", Every: 20 * time.Millisecond}
		o.LookupHost = func(context.Context, string) ([]string, error) { return []string{"127.0.0.1", "127.0.0.2"}, nil }
		o.IsSelf = func(addr string) bool { return addr == self }
	})
	time.Sleep(100 * time.Millisecond) // a few resolutions
	pool := h.p.tbl.Load().upstreams[0].Endpoints()
	if len(pool) != 1 || pool[0].Addr() != strings.TrimPrefix(v4.url, "http://") {
		t.Fatalf("the pool is %d endpoints: %v", len(pool), pool)
	}
	if n := strings.Count(h.logs.String(), "Sturdy's own listener"); n != 1 {
		t.Fatalf("%d warnings of the own address, want 1:\n%s", n, h.logs.String())
	}
	if resp, _ := h.chat(""); resp.StatusCode != 200 {
		t.Fatalf("%d", resp.StatusCode)
	}
}

// TestAConnectionIsKeptWhenTheLastChunkFollowsTheTerminator: a server
// that writes its chunked body's last chunk a moment after [DONE] (as
// uvicorn does) keeps its connection: the rest of the body is read and
// dropped, not cut. Five streams, one connection.
func TestAConnectionIsKeptWhenTheLastChunkFollowsTheTerminator(t *testing.T) {
	t.Parallel()
	var conns atomic.Int64
	addr := upstreamtest.ServeConns(t, func(c net.Conn) {
		conns.Add(1)
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			w := bufio.NewWriter(c)
			fmt.Fprint(w, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
			for _, ch := range upstreamtest.SSE("Hi") {
				fmt.Fprintf(w, "%x\r\n%s\r\n", len(ch), ch)
			}
			_ = w.Flush()
			time.Sleep(5 * time.Millisecond)
			fmt.Fprint(w, "0\r\n\r\n")
			_ = w.Flush()
		}
	})
	h := startProxy(t, "http://"+addr, nil)
	for i := 0; i < 5; i++ {
		if resp, body := h.chat(streamChat); resp.StatusCode != 200 || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
			t.Fatalf("stream %d: %d %q", i, resp.StatusCode, body)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("5 streams took %d upstream connections, want 1", n)
	}
}

// TestAnHTTP10BodyHoldsItsBudgetUntilWritten: a body read whole for an
// HTTP/1.0 client that reads slowly keeps its share of
// server.max_buffered_bytes until it has been written. Before, the share
// was given back when the handler returned, and slow clients held
// 64 MiB each uncounted.
func TestAnHTTP10BodyHoldsItsBudgetUntilWritten(t *testing.T) {
	t.Parallel()
	block := strings.Repeat("x", 1<<20)
	url := forgetfulUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/octet-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for i := 0; i < 16; i++ {
				_, _ = w.WriteString(block)
				_ = w.Flush()
			}
		})
	})
	h := startProxy(t, url, nil)
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "GET /v1/files/x/content HTTP/1.0\r\nHost: x\r\n\r\n")
	waitFor(t, 5*time.Second, "the body read whole", func() bool { return h.p.held.used.Load() >= 8<<20 })
	time.Sleep(200 * time.Millisecond) // the client reads nothing: the write blocks
	if n := h.p.held.used.Load(); n < 8<<20 {
		t.Fatalf("the budget was given back (%d bytes held) before the body reached the client", n)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := io.Copy(io.Discard, conn); err != nil || n < 16<<20 {
		t.Fatalf("read %d bytes: %v", n, err)
	}
	waitFor(t, 5*time.Second, "the budget given back", func() bool { return h.p.held.used.Load() == 0 })
}

// TestRequestBodiesHeldAreBounded: the bodies of requests in flight,
// queued ones included, stay within server.max_request_bytes. One more
// gets 503 server_busy with Retry-After: before its body is read when it
// has a Content-Length (the test sends none of it), at admission when
// chunked. Once the held requests end, their bytes are free again.
// Before, nothing bounded them: 60 queued 30 MiB bodies held 1.99 GB.
func TestRequestBodiesHeldAreBounded(t *testing.T) {
	t.Parallel()
	var held atomic.Int32
	slow, release := heldUpstream(t, &held)
	h := startProxy(t, slow, func(o *Options) { o.Server.MaxRequestBytes = 1 << 20 })
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", 400<<10) + `"}]}`
	done := make(chan int, 2)
	for range 2 {
		go func() {
			resp, err := testClient.Post(h.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				done <- 0
				return
			}
			resp.Body.Close()
			done <- resp.StatusCode
		}()
	}
	waitFor(t, 5*time.Second, "two requests at the upstream", func() bool { return held.Load() == 2 })
	if n := h.p.bodies.used.Load(); n != 2*int64(len(body)) {
		t.Fatalf("%d bytes held, want the two bodies' %d", n, 2*len(body))
	}
	c, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer before the body was sent: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 503 || !strings.Contains(string(b), CodeServerBusy) || resp.Header.Get("Retry-After") != "1" ||
		resp.Header.Get("X-Should-Retry") == "false" {
		t.Fatalf("past the budget, before the body: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	chunked, err := http.NewRequest("POST", h.url+"/v1/chat/completions", io.MultiReader(strings.NewReader(body))) // no length: chunked
	if err != nil {
		t.Fatal(err)
	}
	chunked.Header.Set("Content-Type", "application/json")
	if resp, err := testClient.Do(chunked); err != nil || resp.StatusCode != 503 {
		t.Fatalf("past the budget, chunked: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	close(release)
	for range 2 {
		if s := <-done; s != 200 {
			t.Errorf("a held request: %d", s)
		}
	}
	waitFor(t, 5*time.Second, "the budget free again", func() bool { return h.p.bodies.used.Load() == 0 })
	if resp, b := h.chat(body); resp.StatusCode != 200 {
		t.Fatalf("once the held ones ended: %d %s", resp.StatusCode, b)
	}
}
