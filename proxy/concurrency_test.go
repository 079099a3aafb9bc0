package proxy

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/valyala/fasthttp"

	"sturdy/internal/upstreamtest"
	"sturdy/upstream"
)

// gpuServer is a model server with slots parallel places and a queue
// inside that never refuses: a streamed reply starts ttft after it gets a
// place, then sends tokens words, one every perToken. It is what vLLM or
// Ollama does under load: no error, only waiting.
func gpuServer(t *testing.T, slots int, ttft, perToken time.Duration, tokens int) string {
	t.Helper()
	sem := make(chan struct{}, slots)
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			sem <- struct{}{}
			defer func() { <-sem }()
			time.Sleep(ttft)
			for _, ev := range upstreamtest.SSE(upstreamtest.Words(tokens, "tok ")...) {
				_, _ = w.WriteString(ev)
				if w.Flush() != nil {
					return
				}
				time.Sleep(perToken)
			}
		})
	}}
	return upstreamtest.Serve(t, srv)
}

// endpointConcurrency is the concurrency status of the first endpoint of
// h's first upstream.
func endpointConcurrency(t *testing.T, h *harness) upstream.ConcurrencyStatus {
	t.Helper()
	st := h.p.Upstreams()[0].Endpoints[0].Concurrency
	if st == nil {
		t.Fatal("no concurrency status: concurrency is off")
	}
	return *st
}

// endpointConcurrencyAddr is the address of h's first endpoint.
func endpointConcurrencyAddr(h *harness) string { return h.p.Upstreams()[0].Endpoints[0].Address }

// heldUpstream is an upstream that holds every request until release is
// closed (or 5 s pass), then answers a chat completion; held, when set,
// counts the requests it got.
func heldUpstream(t *testing.T, held *atomic.Int32) (url string, release chan struct{}) {
	release = make(chan struct{})
	url = upstreamtest.Serve(t, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if held != nil {
			held.Add(1)
		}
		select {
		case <-release:
		case <-time.After(5 * time.Second):
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyString(upstreamtest.ChatCompletion("slow"))
	}})
	return url, release
}

const streamBody = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`

func TestAFullConcurrencyQueueShedsWithAWaitOrFailsOver(t *testing.T) {
	t.Parallel()
	var held atomic.Int32
	slow, release := heldUpstream(t, &held)
	spare := upstreamtest.Start(t, upstreamtest.Step{Status: 200, Body: upstreamtest.ChatCompletion("spare")})
	h := startProxy(t, slow, func(o *Options) {
		o.Upstreams[0].Concurrency = upstream.Concurrency{Mode: upstream.ConcurrencyFixed, Max: 1, Queue: upstream.Queue{Max: 1}}
		o.Upstreams[0].QueueTimeout = 3 * time.Second
		o.Upstreams = append(o.Upstreams, testUpstream("spare", spare.URL))
		fb := testRoute("up")
		fb.Name, fb.Model, fb.Fallbacks = "with-spare", "fb-*", []Target{{Upstream: "spare"}}
		o.Routes = append(o.Routes, fb)
	})
	var wg sync.WaitGroup
	statuses := make([]int, 2)
	for i := range statuses { // one holds the place, one waits in the queue
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _ := h.chat("")
			statuses[i] = resp.StatusCode
		}()
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
			if st := endpointConcurrency(t, h); st.InFlight+st.Queued[0] == i+1 {
				break
			}
		}
	}
	resp, body := h.chat("")
	code, _ := errorOf(t, body)
	if resp.StatusCode != 503 || code != CodeUpstreamBusy {
		t.Fatalf("with the queue full: %d %s, want 503 upstream_busy", resp.StatusCode, body)
	}
	if resp.Header.Get("Retry-After") == "" || resp.Header.Get("Retry-After-Ms") == "" || resp.Header.Get("X-Should-Retry") == "false" {
		t.Fatalf("headers %v: want Retry-After and retry-after-ms, and the SDK let retry", resp.Header)
	}
	if !strings.Contains(string(body), "concurrency") {
		t.Fatalf("the error does not say which limit: %s", body)
	}
	if n := testutil.ToFloat64(h.p.m.ConcurrencyShed.WithLabelValues("up", "interactive")); n != 1 {
		t.Fatalf("sturdy_concurrency_shed_total %g, want 1", n)
	}
	h.p.RefreshBreakerGauges()
	if l := testutil.ToFloat64(h.p.m.ConcurrencyLimit.WithLabelValues("up", endpointConcurrencyAddr(h))); l != 1 {
		t.Fatalf("sturdy_concurrency_limit %g, want 1", l)
	}
	resp, body = h.chat(`{"model":"fb-1","messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 200 || resp.Header.Get("X-Sturdy-Upstream") != "spare" {
		t.Fatalf("with a fallback: %d from %q (%s), want the spare's answer", resp.StatusCode, resp.Header.Get("X-Sturdy-Upstream"), body)
	}
	close(release)
	wg.Wait()
	if statuses[0] != 200 || statuses[1] != 200 || held.Load() != 2 {
		t.Fatalf("the holder and the queued one got %v (%d reached the server), want both answered", statuses, held.Load())
	}
	// The queued one's wait, and the two shed ones' (at once: the queue
	// was full), are in the access lines (waits.concurrency) and the wait
	// histogram — as they were: these requests are not traced.
	var queued int
	for _, line := range h.accessLines(4) {
		waits, _ := line["waits"].(map[string]any)
		if w, _ := waits["concurrency"].(float64); w > 0 {
			if w > 5000 {
				t.Fatalf("waits %v: more than the queue's timeout", line["waits"])
			}
			queued++
		}
	}
	var m dto.Metric
	_ = h.p.m.ConcurrencyWait.WithLabelValues("up").(prometheus.Histogram).Write(&m)
	if queued != 3 || m.GetHistogram().GetSampleCount() != 3 || m.GetHistogram().GetSampleSum() > 10 {
		t.Fatalf("%d access lines with a concurrency wait, want 3; wait histogram %d samples summing %gs, want 3 within the test's time",
			queued, m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum())
	}
}

func TestAnAdaptiveLimitFollowsTheServersCapacity(t *testing.T) {
	t.Parallel()
	const slots, clients = 2, 12
	url := gpuServer(t, slots, 20*time.Millisecond, 4*time.Millisecond, 8)
	h := startProxy(t, url, func(o *Options) {
		o.Upstreams[0].Concurrency = upstream.Concurrency{Mode: upstream.ConcurrencyAdaptive, Max: 64,
			Adaptive: upstream.Adaptive{Initial: 8}}
		o.Upstreams[0].QueueTimeout = 10 * time.Second
	})
	var wg sync.WaitGroup
	var ok, failed atomic.Int32
	end := time.Now().Add(3 * time.Second)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < 200 && time.Now().Before(end); n++ {
				resp, body := h.do("POST", "/v1/chat/completions", streamBody, "Content-Type", "application/json")
				if resp.StatusCode == http.StatusOK && strings.Contains(string(body), "[DONE]") {
					ok.Add(1)
				} else {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	st := endpointConcurrency(t, h)
	t.Logf("limit %d after %d streams (short ratio %.2f)", st.Limit, ok.Load(), st.Short)
	if failed.Load() != 0 || ok.Load() < 20 {
		t.Fatalf("%d streams failed, %d answered: the server never errs, so neither should Sturdy", failed.Load(), ok.Load())
	}
	if st.Limit >= 8 || st.Limit < 1 {
		t.Fatalf("limit %d with %d clients on %d slots: want it below where it started (8), following the server",
			st.Limit, clients, slots)
	}
}

func TestAPriorityHeaderIsReadWhereTheRouteLetsIt(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 200, Body: upstreamtest.ChatCompletion("ok")})
	h := startProxy(t, up.URL, func(o *Options) {
		o.Upstreams[0].Concurrency = upstream.Concurrency{Mode: upstream.ConcurrencyFixed}
		o.Routes[0].PriorityHeader = true
	})
	for _, tt := range []struct{ value, want string }{{"batch", "200"}, {"Interactive", "200"}, {"urgent", "400"}} {
		resp, body := h.chat("", "X-Sturdy-Priority", tt.value)
		if fmt.Sprint(resp.StatusCode) != tt.want {
			t.Errorf("x-sturdy-priority: %s: %d %s, want %s", tt.value, resp.StatusCode, body, tt.want)
		}
	}
	for _, r := range up.Requests() {
		if _, ok := r.Header["X-Sturdy-Priority"]; ok {
			t.Fatal("x-sturdy-priority was sent on to the upstream")
		}
	}
}

func TestAReloadKeepsWhatAnEndpointsLimitLearned(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 200, Body: upstreamtest.ChatCompletion("ok")})
	o := Options{Upstreams: []upstream.Options{testUpstream("up", up.URL)}, Routes: []Route{testRoute("up")}}
	o.Upstreams[0].Concurrency = upstream.Concurrency{Mode: upstream.ConcurrencyAdaptive}
	p, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Shutdown(t.Context()) }()
	first := p.tbl.Load().upstreams[0].Endpoints()[0]
	o.Upstreams[0].RateLimit = upstream.RateLimit{RequestsPerSecond: 100} // another setting of the upstream
	if _, err := p.Reload(o); err != nil {
		t.Fatal(err)
	}
	if p.tbl.Load().upstreams[0].Endpoints()[0] != first {
		t.Fatal("a reload that kept the endpoint's settings built it anew: its limit starts over")
	}
	o.Upstreams[0].Concurrency.Max = 8
	if _, err := p.Reload(o); err != nil {
		t.Fatal(err)
	}
	ep := p.tbl.Load().upstreams[0].Endpoints()[0]
	if ep == first || !ep.Concurrent() {
		t.Fatal("a reload that changed the endpoint's concurrency kept the old limit")
	}
}

// TestAQueuedRequestWaitsOneQueueTimeoutInAll: a request that waited
// for its max_in_flight slot waits for a concurrency place only what is
// left of queue_timeout, not a second one.
func TestAQueuedRequestWaitsOneQueueTimeoutInAll(t *testing.T) {
	t.Parallel()
	const queueTimeout = 3 * time.Second // the fault it guards waits 1.5 × (4.5 s): a loaded machine's noise is under 1 s
	slow, release := heldUpstream(t, nil)
	h := startProxy(t, slow, func(o *Options) {
		o.Upstreams[0].Timeouts.FirstByte = 30 * time.Second // the holder holds its place for the whole test
		o.Upstreams[0].MaxInFlight, o.Upstreams[0].QueueTimeout = 2, queueTimeout
		o.Upstreams[0].Concurrency = upstream.Concurrency{Mode: upstream.ConcurrencyFixed, Max: 1}
	})
	defer close(release) // before the proxy's shutdown waits for the holder
	go h.chat("")        // holds the one place (and a slot)
	for end := time.Now().Add(2 * time.Second); endpointConcurrency(t, h).InFlight == 0 && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
	go h.chat("") // holds the other slot, waiting for the place until it gives up
	for end := time.Now().Add(2 * time.Second); endpointConcurrency(t, h).Queued[0] == 0 && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(queueTimeout / 2)
	start := time.Now()
	resp, body := h.chat("") // waits for a slot (~600 ms), then for the place: what is left
	took := time.Since(start)
	if resp.StatusCode != 503 {
		t.Fatalf("%d %s, want 503 upstream_busy", resp.StatusCode, body)
	}
	if took > queueTimeout+queueTimeout/3 {
		t.Fatalf("it waited %v in queues, want about queue_timeout (%v) in all", took, queueTimeout)
	}
}

// TestOnlyAStreamsFirstContentMovesAnAdaptiveLimit: a streamed reply's
// first content is a sample (one that came in one write too); a reply
// read whole, a stream that ended while Sturdy still held it for its
// first content, and a stream held by stream_hold are not
// (their first byte, or the moment they are let go, mixes in the
// output's length).
func TestOnlyAStreamsFirstContentMovesAnAdaptiveLimit(t *testing.T) {
	t.Parallel()
	sse := [][2]string{upstreamtest.SSEHeader}
	for _, tc := range []struct {
		name    string
		step    upstreamtest.Step
		hold    bool
		samples int
	}{
		{"a stream, token by token", upstreamtest.Step{Header: sse, Chunks: upstreamtest.SSE("a", "b", "c"), ChunkDelay: 10 * time.Millisecond}, false, 3},
		{"a reply read whole", upstreamtest.Step{Body: upstreamtest.ChatCompletion("ok")}, false, 0},
		{"a stream in one write", upstreamtest.Step{Header: sse, Chunks: []string{strings.Join(upstreamtest.SSE("a", "b"), "")}}, false, 3},
		{"a stream that ended while held, no content in it", upstreamtest.Step{Header: sse, Chunks: []string{
			`data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}` + "\n\n", "data: [DONE]\n\n"}, ChunkDelay: 10 * time.Millisecond}, false, 0},
		{"a stream under stream_hold", upstreamtest.Step{Header: sse, Chunks: upstreamtest.SSE("a", "b", "c"), ChunkDelay: 10 * time.Millisecond}, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := upstreamtest.Start(t, tc.step, tc.step, tc.step)
			h := startProxy(t, up.URL, func(o *Options) {
				o.Upstreams[0].Concurrency = upstream.Concurrency{Mode: upstream.ConcurrencyAdaptive}
				if tc.hold {
					o.Routes[0].StreamHold = StreamHold{Max: 200 * time.Millisecond, Bytes: 1 << 10}
				}
			})
			for range 3 {
				if resp, body := h.do("POST", "/v1/chat/completions", streamBody, "Content-Type", "application/json"); resp.StatusCode != 200 {
					t.Fatalf("%d %s", resp.StatusCode, body)
				}
			}
			h.accessLines(3) // all three have ended, their leases given back
			if st := endpointConcurrency(t, h); st.Samples[0] != tc.samples {
				t.Fatalf("%d samples, want %d", st.Samples[0], tc.samples)
			}
		})
	}
}

// TestAStreamsFirstContentIsASampleAsItComes: an adaptive limit hears of
// a stream's first content while the stream still runs — fed when the
// place was given back, the signal came a whole reply late, and the limit
// swung far past the server's slots and back (the bench's overload
// scenario).
func TestAStreamsFirstContentIsASampleAsItComes(t *testing.T) {
	t.Parallel()
	end := make(chan struct{})
	up := upstreamtest.Serve(t, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			chunks := upstreamtest.SSE("a", "b")
			_, _ = w.WriteString(chunks[0])
			_ = w.Flush()
			select {
			case <-end:
			case <-time.After(5 * time.Second):
			}
			_, _ = w.WriteString(strings.Join(chunks[1:], ""))
		})
	}})
	h := startProxy(t, up, func(o *Options) {
		o.Upstreams[0].Concurrency = upstream.Concurrency{Mode: upstream.ConcurrencyAdaptive}
	})
	resp, err := http.Post(h.url+"/v1/chat/completions", "application/json", strings.NewReader(streamBody))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.Contains(line, `"a"`) {
		t.Fatalf("first line %q, %v", line, err)
	}
	st := endpointConcurrency(t, h)
	close(end)
	if st.Samples[0] != 1 || st.InFlight != 1 {
		t.Fatalf("%d samples with %d in flight at the stream's first content, want 1 with it in flight", st.Samples[0], st.InFlight)
	}
}

// TestAnErrorEventBeforeContentIsNoSample: a stream that fails in band
// before its first content (vLLM's overloaded engine) is retried, and only
// the retry's first content is a sample — the error came fast, and read
// as a reply's start it would tell the limit the server is quick; the
// overload it tells backs the limit off, as a 503 would.
func TestAnErrorEventBeforeContentIsNoSample(t *testing.T) {
	t.Parallel()
	sse := [][2]string{upstreamtest.SSEHeader}
	up := upstreamtest.Start(t, upstreamtest.Step{Header: sse, Chunks: []string{vllmError}},
		upstreamtest.Step{Header: sse, Chunks: upstreamtest.SSE("a", "b")})
	h := startProxy(t, up.URL, func(o *Options) {
		o.Upstreams[0].Concurrency = upstream.Concurrency{Mode: upstream.ConcurrencyAdaptive}
	})
	if resp, body := h.do("POST", "/v1/chat/completions", streamBody, "Content-Type", "application/json"); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	h.accessLines(1)
	if st := endpointConcurrency(t, h); st.Samples[0] != 1 || len(up.Requests()) != 2 || st.Limit != 3 {
		t.Fatalf("%d samples of %d attempts, limit %d; want 1 of 2, and the overload told in band backing 4 off to 3",
			st.Samples[0], len(up.Requests()), st.Limit)
	}
}

// clientFrom is an HTTP client whose connections come from the loopback
// address ip (127.0.0.0/8 is all loopback), so a test can play several
// sources.
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

// postFrom posts a chat request as c, with credential key; 0 when it
// failed to get an answer.
func postFrom(c *http.Client, url, key string) int {
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := c.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestInventedCredentialsAreOneTenant: without auth.keys a credential
// costs nothing to invent, so a queue's tenants are sources: a flood
// with a new credential per request from one address is one tenant, and
// a client from another address still gets a place in the full queue.
// Before, each invented credential was a tenant with one waiter, and
// the real client was shed at once (40 of 40 503 upstream_busy).
func TestInventedCredentialsAreOneTenant(t *testing.T) {
	t.Parallel()
	var held atomic.Int32
	slow, release := heldUpstream(t, &held)
	h := startProxy(t, slow, func(o *Options) {
		o.Upstreams[0].Concurrency = upstream.Concurrency{Mode: upstream.ConcurrencyFixed, Max: 1, Queue: upstream.Queue{Max: 4}}
		o.Upstreams[0].QueueTimeout = 5 * time.Second
	})
	flood, real := clientFrom("127.0.0.2"), clientFrom("127.0.0.3")
	done := make(chan int, 8)
	for i := range 6 { // one at the upstream, four queued, one shed
		go func() { done <- postFrom(flood, h.url, fmt.Sprint("sk-invented-", i)) }()
	}
	waitFor(t, 5*time.Second, "the queue full", func() bool {
		st := endpointConcurrency(t, h)
		return st.InFlight == 1 && st.Queued[0] == 4
	})
	realDone := make(chan int, 1)
	go func() { realDone <- postFrom(real, h.url, "sk-real") }()
	waitFor(t, 5*time.Second, "a flood request shed for the real client", func() bool {
		return testutil.ToFloat64(h.p.m.ConcurrencyShed.WithLabelValues("up", "interactive")) >= 2
	})
	close(release)
	if s := <-realDone; s != 200 {
		t.Fatalf("the real client from another address: %d, want its answer", s)
	}
	statuses := map[int]int{}
	for range 6 {
		statuses[<-done]++
	}
	if statuses[200] != 4 || statuses[503] != 2 {
		t.Fatalf("the flood's statuses %v, want 4 answered and 2 shed", statuses)
	}
}
