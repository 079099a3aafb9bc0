package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"sturdy/breaker"
	"sturdy/internal/upstreamtest"
	"sturdy/policy"
	"sturdy/tracing"
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

// TestDebugUpstreamsListsAtMost256ModelBreakers: an endpoint's reply
// breakers shown are bounded whatever the group holds.
func TestDebugUpstreamsListsAtMost256ModelBreakers(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "{}"})
	h := startProxy(t, up.URL, nil)
	ep := h.p.tbl.Load().upstreams[0].endpointsNow()[0]
	ep.models = breaker.NewGroup("up", breaker.GroupSettings{Max: 1000})
	for i := 0; i < 600; i++ {
		ep.models.Get(fmt.Sprint("model-", i), time.Now())
	}
	if n := len(h.p.Upstreams()[0].ModelBreakers); n != maxListedModelBreakers {
		t.Fatalf("%d model breakers listed, want %d", n, maxListedModelBreakers)
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

func TestDiscardTrailer(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, in string
		want     error
	}{
		{"none", "\r\n", nil},
		{"fields", "Set-Cookie: a=1\r\nX-Sum: 2\r\n\r\nnext", nil},
		{"bare LF", "X: 1\n\n", nil},
		{"cut", "X: 1\r\n", io.ErrUnexpectedEOF},
		{"one long line", "X: " + strings.Repeat("x", 9<<10) + "\r\n\r\n", errTrailerTooLarge},
		{"many lines", strings.Repeat("X: 12345678\r\n", 1000) + "\r\n", errTrailerTooLarge},
	} {
		br := bufio.NewReaderSize(strings.NewReader(tt.in), 16)
		if err := discardTrailer(br); err != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
}
