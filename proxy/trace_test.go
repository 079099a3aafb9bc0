package proxy

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"sturdy/internal/otlptest"
	"sturdy/internal/upstreamtest"
	"sturdy/tracing"
	"sturdy/upstream"
)

// withTracing points the proxy's tracing at rcv; the SDK exports every
// 20ms (OTEL_BSP_SCHEDULE_DELAY, set for every test by TestMain rather
// than with tb.Setenv, so that tests tracing this way run in parallel).
func withTracing(tb testing.TB, o *Options, rcv *otlptest.Receiver, ratio float64) {
	tb.Helper()
	if os.Getenv("OTEL_BSP_SCHEDULE_DELAY") != traceExportEvery {
		tb.Fatalf("OTEL_BSP_SCHEDULE_DELAY is %q, not TestMain's %s", os.Getenv("OTEL_BSP_SCHEDULE_DELAY"), traceExportEvery)
	}
	o.Tracing = &Tracing{Settings: tracing.Settings{URL: rcv.URL + "/v1/traces", Protocol: tracing.ProtocolHTTP,
		SampleRatio: ratio, ServiceName: "sturdy-test"}, Version: "test"}
}

const clientTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// serverSpan returns the trace's server span and its attempts (client
// spans under it), in start order, once the server span is in.
func serverSpan(t *testing.T, rcv *otlptest.Receiver, traceID string, attempts int) (otlptest.Span, []otlptest.Span) {
	t.Helper()
	var root otlptest.Span
	spans := rcv.Await(t, 5*time.Second, func(spans []otlptest.Span) bool {
		for _, s := range otlptest.Trace(spans, traceID) {
			if s.Kind == tracepb.Span_SPAN_KIND_SERVER {
				root = s
				return len(otlptest.Children(spans, s.ID)) >= attempts
			}
		}
		return false
	})
	return root, otlptest.Children(spans, root.ID)
}

// traceparentSpan returns the trace and span id of a traceparent header.
func traceparentSpan(t *testing.T, tp string) (traceID, spanID, flags string) {
	t.Helper()
	f := strings.Split(tp, "-")
	if len(f) != 4 || f[0] != "00" || len(f[1]) != 32 || len(f[2]) != 16 {
		t.Fatalf("traceparent %q", tp)
	}
	return f[1], f[2], f[3]
}

func TestTraceOfARequestRetriedTwiceThatFailsOver(t *testing.T) {
	t.Parallel()
	rcv := otlptest.Start(t)
	primary := upstreamtest.Start(t,
		upstreamtest.Step{Status: 503},
		upstreamtest.Step{Status: 503, Header: [][2]string{{"Retry-After-Ms", "60"}}},
		upstreamtest.Step{Status: 503})
	fallback := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.JSONHeader},
		Body: `{"id":"c1","model":"llama3.1-8b","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}`})
	h := startProxy(t, primary.URL, func(o *Options) {
		o.Routes[0].Retry.MaxAttempts = 3
		withFallbacks(o, []string{fallback.URL}, "llama3.1")
		withTracing(t, o, rcv, 1)
	})
	resp, body := h.chat(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`,
		"traceparent", clientTraceparent, "tracestate", "vendor=opaque", "Authorization", "Bearer sk-secret-client-key")
	if resp.StatusCode != 200 {
		t.Fatalf("got %d %s", resp.StatusCode, body)
	}
	root, attempts := serverSpan(t, rcv, "4bf92f3577b34da6a3ce929d0e0e4736", 4)
	if root.ParentID != "00f067aa0ba902b7" {
		t.Fatalf("server span's parent %q, want the client's span", root.ParentID)
	}
	if root.Name != "POST /" || root.Attrs["http.route"] != "/" || root.Attrs["http.request.method"] != "POST" ||
		root.Attrs["url.path"] != "/v1/chat/completions" || root.Attrs["http.response.status_code"] != int64(200) ||
		root.Attrs["sturdy.outcome"] != "ok" || root.Attrs["sturdy.attempts"] != int64(4) || root.Attrs["sturdy.upstream"] != "b" ||
		root.Attrs["gen_ai.request.model"] != "gpt-4o" || root.Attrs["gen_ai.response.model"] != "llama3.1-8b" ||
		root.Attrs["gen_ai.usage.input_tokens"] != int64(7) || root.Attrs["gen_ai.usage.output_tokens"] != int64(3) ||
		root.Attrs["gen_ai.operation.name"] != "chat" || root.Attrs["gen_ai.provider.name"] != "openai" ||
		root.Resource["service.name"] != "sturdy-test" {
		t.Fatalf("server span %q %v resource %v", root.Name, root.Attrs, root.Resource)
	}
	if len(attempts) != 4 {
		t.Fatalf("%d attempt spans, want 4", len(attempts))
	}
	want := []struct {
		upstream, model, decision, url string
		status                         int64
	}{{"up", "gpt-4o", "retry", primary.URL, 503}, {"up", "gpt-4o", "retry", primary.URL, 503},
		{"up", "gpt-4o", "failover", primary.URL, 503}, {"b", "llama3.1", "stop", fallback.URL, 200}}
	for i, a := range attempts {
		w := want[i]
		if u, _ := url.Parse(w.url); a.Attrs["url.full"] != w.url+"/v1/chat/completions" ||
			a.Attrs["server.address"] != u.Hostname() || fmt.Sprint(a.Attrs["server.port"]) != u.Port() {
			t.Fatalf("attempt %d: url.full %v, server %v:%v, want %s", i+1, a.Attrs["url.full"],
				a.Attrs["server.address"], a.Attrs["server.port"], w.url)
		}
		if a.Kind != tracepb.Span_SPAN_KIND_CLIENT || a.Attrs["sturdy.upstream"] != w.upstream ||
			a.Attrs["gen_ai.request.model"] != w.model || a.Attrs["sturdy.decision"] != w.decision ||
			a.Attrs["http.response.status_code"] != w.status || a.Attrs["sturdy.attempt"] != int64(i+1) ||
			a.Attrs["sturdy.breaker.connection"] != "closed" || a.Attrs["server.port"] == nil {
			t.Fatalf("attempt %d: %q %v", i+1, a.Name, a.Attrs)
		}
		if i < 3 && (a.Attrs["sturdy.retry_reason"] != "5xx" || a.StatusCode != tracepb.Status_STATUS_CODE_ERROR ||
			a.Attrs["error.type"] != "503") {
			t.Fatalf("failed attempt %d: %v status %v", i+1, a.Attrs, a.StatusCode)
		}
		if i > 0 && a.Attrs["http.request.resend_count"] != int64(i) {
			t.Fatalf("attempt %d resend_count %v", i+1, a.Attrs["http.request.resend_count"])
		}
		if i < 3 && a.End.After(attempts[i+1].Start) {
			t.Fatalf("attempt %d's span ends after the next one starts", i+1)
		}
	}
	// Each upstream request carried its own attempt's traceparent, and
	// the client's tracestate.
	var seen []http.Header
	for _, r := range append(primary.Requests(), fallback.Requests()...) {
		hd := http.Header{}
		for k, v := range r.Header {
			hd.Set(k, v)
		}
		seen = append(seen, hd)
	}
	for i, hd := range seen {
		tid, sid, flags := traceparentSpan(t, hd.Get("Traceparent"))
		if tid != attempts[i].TraceID || sid != attempts[i].ID || flags != "01" {
			t.Fatalf("upstream request %d traceparent %q, want span %s", i+1, hd.Get("Traceparent"), attempts[i].ID)
		}
		if hd.Get("Tracestate") != "vendor=opaque" {
			t.Fatalf("upstream request %d tracestate %q", i+1, hd.Get("Tracestate"))
		}
	}
	// The waits: a backoff Sturdy chose, then the server's Retry-After.
	var waits []otlptest.Event
	for _, e := range root.Events {
		if e.Name == "backoff" || e.Name == "retry_after" {
			waits = append(waits, e)
		}
	}
	if len(waits) != 2 || waits[0].Name != "backoff" || waits[0].Attrs["sturdy.wait.source"] != "sturdy" ||
		waits[1].Name != "retry_after" || waits[1].Attrs["sturdy.wait.source"] != "server" ||
		waits[1].Attrs["sturdy.wait.ms"].(float64) < 50 {
		t.Fatalf("wait events %v", waits)
	}
	if c, ok := root.Event("commit"); !ok || c.Attrs["sturdy.stream"] != false {
		t.Fatalf("commit event %v (%v)", c, ok)
	}
	line := h.accessLines(1)[0]
	if line["trace_id"] != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("access line trace_id %v", line["trace_id"])
	}
	if raw := string(rcv.Raw()); strings.Contains(raw, "sk-secret-client-key") || strings.Contains(raw, "Bearer") {
		t.Fatal("a credential reached an exported span")
	}
}

func TestTraceOfAStreamEndsWithTheStream(t *testing.T) {
	t.Parallel()
	rcv := otlptest.Start(t)
	chunks := upstreamtest.SSE("Hello", " there")
	usage := `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m-2","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":2,"total_tokens":13}}` + "\n\n"
	chunks = append(chunks[:len(chunks)-1], usage, chunks[len(chunks)-1])
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{{"Content-Type", "text/event-stream"}}, Chunks: chunks,
		ChunkDelay: 30 * time.Millisecond})
	h := startProxy(t, up.URL, func(o *Options) { withTracing(t, o, rcv, 1) })
	resp, body := h.chat(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "[DONE]") {
		t.Fatalf("got %d %s", resp.StatusCode, body)
	}
	line := h.accessLines(1)[0]
	traceID, _ := line["trace_id"].(string)
	if len(traceID) != 32 {
		t.Fatalf("access line trace_id %v", line["trace_id"])
	}
	root, attempts := serverSpan(t, rcv, traceID, 1)
	if root.ParentID != "" {
		t.Fatalf("a request without traceparent starts a trace; parent %q", root.ParentID)
	}
	commit, ok := root.Event("commit")
	if !ok || commit.Attrs["sturdy.stream"] != true {
		t.Fatalf("commit event %v (%v)", commit, ok)
	}
	if root.Attrs["sturdy.stream"] != true || root.Attrs["gen_ai.usage.input_tokens"] != int64(11) ||
		root.Attrs["gen_ai.usage.output_tokens"] != int64(2) || root.Attrs["gen_ai.response.model"] != "m-2" ||
		root.Attrs["http.response.body.size"] != int64(len(body)) || root.Attrs["sturdy.ttft_ms"] == nil {
		t.Fatalf("server span %v", root.Attrs)
	}
	a := attempts[0]
	// The attempt's span covers the streamed body: it ends after the
	// last chunk, well after the commit.
	if len(attempts) != 1 || a.End.Sub(commit.Time) < 80*time.Millisecond || a.Attrs["sturdy.decision"] != "stop" {
		t.Fatalf("attempt %v, ends %v after the commit", a.Attrs, a.End.Sub(commit.Time))
	}
	if a.End.After(root.End) {
		t.Fatal("the attempt ends after its request")
	}
}

func TestTraceOfAClientThatLeaves(t *testing.T) {
	t.Parallel()
	rcv := otlptest.Start(t)
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 503, Header: [][2]string{{"Retry-After", "5"}}})
	h := startProxy(t, up.URL, func(o *Options) { withTracing(t, o, rcv, 1) })
	req, _ := http.NewRequest("POST", h.url+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
	req.Header.Set("traceparent", clientTraceparent)
	c := &http.Client{Timeout: 1500 * time.Millisecond} // well inside the 5 s wait, well after the first 503 on a loaded machine
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("the request was answered")
	}
	root, attempts := serverSpan(t, rcv, "4bf92f3577b34da6a3ce929d0e0e4736", 1)
	gone, ok := root.Event("client_gone")
	if !ok || gone.Attrs["sturdy.phase"] != "retry_after" || root.Attrs["sturdy.outcome"] != "client_gone" {
		t.Fatalf("server span %v events %v", root.Attrs, root.Events)
	}
	if w, ok := root.Event("retry_after"); !ok || w.Attrs["sturdy.wait.ms"].(float64) < 5000 {
		t.Fatalf("retry_after event %v", w)
	}
	if len(attempts) != 1 || attempts[0].Attrs["sturdy.decision"] != "retry" {
		t.Fatalf("attempts %v", attempts)
	}
	if up.Count() != 1 {
		t.Fatalf("upstream saw %d requests after the client left", up.Count())
	}
}

func TestTracingOffPassesTraceHeadersUntouched(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "{}"})
	h := startProxy(t, up.URL, nil)
	h.chat("", "traceparent", clientTraceparent, "tracestate", "a=b")
	r := up.Requests()[0]
	if r.Header["Traceparent"] != clientTraceparent || r.Header["Tracestate"] != "a=b" {
		t.Fatalf("upstream got traceparent %q tracestate %q", r.Header["Traceparent"], r.Header["Tracestate"])
	}
	if strings.Contains(h.logs.String(), "trace_id") {
		t.Fatal("trace_id logged with tracing off")
	}
}

func TestSamplingFollowsASampledParent(t *testing.T) {
	t.Parallel()
	rcv := otlptest.Start(t)
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "{}"})
	h := startProxy(t, up.URL, func(o *Options) { withTracing(t, o, rcv, 0) })
	h.chat("", "traceparent", clientTraceparent)                                         // sampled: followed
	h.chat("", "traceparent", "00-11111111111111111111111111111111-2222222222222222-00") // not sampled
	h.chat("")                                                                           // a root at ratio 0
	root, _ := serverSpan(t, rcv, "4bf92f3577b34da6a3ce929d0e0e4736", 1)
	if root.Name != "POST /" {
		t.Fatalf("span %q", root.Name)
	}
	reqs := up.Requests()
	if _, _, flags := traceparentSpan(t, reqs[1].Header["Traceparent"]); flags != "00" ||
		!strings.HasPrefix(reqs[1].Header["Traceparent"], "00-11111111111111111111111111111111-") {
		t.Fatalf("an unsampled trace goes on unsampled: %q", reqs[1].Header["Traceparent"])
	}
	if _, _, flags := traceparentSpan(t, reqs[2].Header["Traceparent"]); flags != "00" {
		t.Fatalf("a root not sampled sends %q", reqs[2].Header["Traceparent"])
	}
	// Flush: shutting down exports everything; only the sampled trace
	// is there.
	h.p.tracers.stop(&h.p.log)
	for _, s := range rcv.Spans() {
		if s.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Fatalf("an unsampled span was exported: %v", s)
		}
	}
}

func TestTracingHotReloads(t *testing.T) {
	t.Parallel()
	rcv := otlptest.Start(t)
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "{}"})
	var o Options
	h := startProxy(t, up.URL, func(opts *Options) { o = *opts })
	h.chat("", "traceparent", clientTraceparent)
	withTracing(t, &o, rcv, 1)
	if _, err := h.p.Reload(o); err != nil {
		t.Fatal(err)
	}
	h.chat("", "traceparent", clientTraceparent)
	serverSpan(t, rcv, "4bf92f3577b34da6a3ce929d0e0e4736", 1)
	if tp := up.Requests()[1].Header["Traceparent"]; tp == clientTraceparent {
		t.Fatal("after the reload the attempt sends the client's traceparent, not its own")
	}
	o.Tracing = nil
	if _, err := h.p.Reload(o); err != nil {
		t.Fatal(err)
	}
	h.chat("", "traceparent", clientTraceparent)
	if tp := up.Requests()[2].Header["Traceparent"]; tp != clientTraceparent {
		t.Fatalf("tracing off again: upstream got %q", tp)
	}
	if !strings.Contains(h.logs.String(), `"tracing on"`) || !strings.Contains(h.logs.String(), `"tracing off"`) {
		t.Fatalf("reloads not logged: %s", h.logs.String())
	}
}

func TestSplitHostPort(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in, scheme, host string
		port             int
	}{{"127.0.0.1:8080", "http", "127.0.0.1", 8080}, {"example.com", "https", "example.com", 443}, {"example.com", "http", "example.com", 80},
		{"[::1]:9", "http", "::1", 9}, {"[::1]", "https", "::1", 443}, {"h:", "http", "h", 80}} {
		if h, p := upstream.SplitHostPort(c.in, c.scheme); h != c.host || p != c.port {
			t.Errorf("%q: %q %d", c.in, h, p)
		}
	}
}

func TestTracingOverGRPC(t *testing.T) {
	t.Parallel()
	rcv := otlptest.StartGRPC(t)
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "{}"})
	h := startProxy(t, up.URL, func(o *Options) {
		withTracing(t, o, rcv, 1)
		o.Tracing.URL, o.Tracing.Protocol = rcv.URL, tracing.ProtocolGRPC
		o.Tracing.Headers = map[string]string{"x-collector-token": "t0ken"}
	})
	h.chat("", "traceparent", clientTraceparent)
	root, attempts := serverSpan(t, rcv, "4bf92f3577b34da6a3ce929d0e0e4736", 1)
	if root.Attrs["http.response.status_code"] != int64(200) || len(attempts) != 1 {
		t.Fatalf("server span %v, %d attempts", root.Attrs, len(attempts))
	}
	if got := rcv.Headers()[0].Get("x-collector-token"); got != "t0ken" {
		t.Fatalf("export metadata x-collector-token %q", got)
	}
}

func TestTraceOfARescuedStream(t *testing.T) {
	t.Parallel()
	rcv := otlptest.Start(t)
	primary := upstreamtest.Start(t, cutAfter(upstreamtest.Cut, "Hel", "lo"))
	fallback := upstreamtest.Start(t, continuationOf(" wor", "ld"))
	h := startRescue(t, primary, fallback, upstream.ContinuePrefill, func(o *Options) { withTracing(t, o, rcv, 1) })
	if resp, body := h.chat(streamChat, "traceparent", clientTraceparent); resp.StatusCode != 200 || !strings.Contains(string(body), "[DONE]") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	root, attempts := serverSpan(t, rcv, "4bf92f3577b34da6a3ce929d0e0e4736", 2)
	if e, ok := root.Event("rescue"); !ok || e.Attrs["sturdy.rescue.result"] != "continued" || root.Attrs["sturdy.rescued"] != int64(1) {
		t.Fatalf("server span %v events %v", root.Attrs, root.Events)
	}
	cut, cont := attempts[0], attempts[1]
	if cut.Attrs["error.type"] != "stream_interrupted" || cut.StatusCode != tracepb.Status_STATUS_CODE_ERROR ||
		cont.Attrs["sturdy.continuation"] != true || cont.Attrs["sturdy.upstream"] != "fb" || cont.StatusCode == tracepb.Status_STATUS_CODE_ERROR {
		t.Fatalf("cut %v\ncontinuation %v", cut.Attrs, cont.Attrs)
	}
	if tid, sid, _ := traceparentSpan(t, fallback.Requests()[0].Header["Traceparent"]); tid != cont.TraceID || sid != cont.ID {
		t.Fatal("the continuation's request does not carry its own span")
	}
}

func TestTraceNamesPacingAndQueueWaits(t *testing.T) {
	t.Parallel()
	rcv := otlptest.Start(t)
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "{}", Delay: 150 * time.Millisecond})
	h := startProxy(t, up.URL, func(o *Options) {
		// A turn every 2 s: the second request waits for it however slow a
		// loaded machine makes the first.
		o.Upstreams[0].RateLimit = upstream.RateLimit{RequestsPerSecond: 0.5, Burst: 1, MaxWait: 5 * time.Second}
		o.Upstreams[0].MaxInFlight, o.Upstreams[0].QueueTimeout = 1, 5*time.Second
		withTracing(t, o, rcv, 1)
	})
	done := make(chan struct{})
	go func() { defer close(done); h.chat("") }()
	time.Sleep(30 * time.Millisecond) // the first holds the one slot
	h.chat("")
	<-done
	spans := rcv.Await(t, 5*time.Second, func(spans []otlptest.Span) bool {
		n := 0
		for _, s := range spans {
			if s.Kind == tracepb.Span_SPAN_KIND_SERVER {
				n++
			}
		}
		return n == 2
	})
	var queued, paced bool
	for _, s := range spans {
		if e, ok := s.Event("queue"); ok && e.Attrs["sturdy.wait.source"] == "max_in_flight" && e.Attrs["sturdy.wait.ms"].(float64) > 50 {
			queued = true
		}
		if e, ok := s.Event("pacing"); ok && e.Attrs["sturdy.wait.source"] == "rate_limit" {
			paced = true
		}
	}
	if !queued || !paced {
		t.Fatalf("queue %v, pacing %v in %v", queued, paced, spans)
	}
}

func TestACollectorThatIsDownCostsRequestsNothing(t *testing.T) {
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "{}"})
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "10") // export (and fail) often
	h := startProxy(t, up.URL, func(o *Options) {
		o.Tracing = &Tracing{Settings: tracing.Settings{URL: "http://" + freePort(t) + "/v1/traces", Protocol: tracing.ProtocolHTTP,
			SampleRatio: 1, ServiceName: "s"}}
	})
	start := time.Now()
	for i := range 50 {
		if resp, _ := h.chat(""); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("50 requests took %v with the collector down", d)
	}
}

func TestAnAttemptSpanHasTheBreakersStateAfterIt(t *testing.T) {
	t.Parallel()
	rcv := otlptest.Start(t)
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 503})
	h := startProxy(t, up.URL, func(o *Options) {
		o.Upstreams[0].Breaker.ConsecutiveFailures = 1
		o.Routes[0].Retry.MaxAttempts = 1
		withTracing(t, o, rcv, 1)
	})
	h.chat("", "traceparent", clientTraceparent)
	_, attempts := serverSpan(t, rcv, "4bf92f3577b34da6a3ce929d0e0e4736", 1)
	if a := attempts[0].Attrs; a["sturdy.breaker.model"] != "open" {
		t.Fatalf("the attempt that opened the model breaker says %v", a["sturdy.breaker.model"])
	}
}

func TestUsageOfABodyReadWholeForAnHTTP10Client(t *testing.T) {
	t.Parallel()
	rcv := otlptest.Start(t)
	chunks := upstreamtest.SSE("Hi")
	usage := `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m-3","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1}}` + "\n\n"
	chunks = append(chunks[:len(chunks)-1], usage, chunks[len(chunks)-1])
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{{"Content-Type", "text/event-stream"}}, Chunks: chunks})
	h := startProxy(t, up.URL, func(o *Options) { withTracing(t, o, rcv, 1) })
	body := `{"model":"m","stream":true}`
	resp, got := h.raw("POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\ntraceparent: " + clientTraceparent +
		"\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	if resp.StatusCode != 200 || !strings.Contains(string(got), "[DONE]") {
		t.Fatalf("%d %s", resp.StatusCode, got)
	}
	root, _ := serverSpan(t, rcv, "4bf92f3577b34da6a3ce929d0e0e4736", 1)
	if root.Attrs["gen_ai.usage.input_tokens"] != int64(5) || root.Attrs["gen_ai.response.model"] != "m-3" {
		t.Fatalf("server span %v", root.Attrs)
	}
	if c, ok := root.Event("commit"); !ok || c.Attrs["sturdy.stream"] != false {
		t.Fatalf("commit %v", c)
	}
}
