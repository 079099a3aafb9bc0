package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sturdy/events"
	"sturdy/internal/upstreamtest"
	"sturdy/policy"
	"sturdy/upstream"
)

const usageChunkSSE = `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":11}}` + "\n\n"

func sseWithUsage(text string) string {
	return `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"` + text + `"}}]}` + "\n\n" +
		usageChunkSSE + "data: [DONE]\n\n"
}

// TestAWholeSSEReplysUsageIsReadAndNotShown: an SSE reply with a
// Content-Length, read whole with its head, is set whole without the
// usage chunk Sturdy asked for, and is charged that usage (18), not its
// input estimate.
func TestAWholeSSEReplysUsageIsReadAndNotShown(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{{"Content-Type", "text/event-stream"}}, Body: sseWithUsage("hello")})
	h := budgeted(t, up.URL, TokenLimits{TokensPerMinute: 1000})
	resp, body := h.chat(asking(20, true), "Authorization", "Bearer k")
	if strings.Contains(string(body), `"usage":{`) {
		t.Errorf("client that did not ask for usage got it: %d %q", resp.StatusCode, body)
	}
	up.SetScript(chatUsage(0, 0))
	if got := remaining(t, h, 1000, "k"); got != 1000-18 {
		t.Errorf("remaining %d, want %d (usage not read)", got, 1000-18)
	}
}

// TestAnSSEReplyOfKnownLengthWithoutItsUsageIsSentChunked: longer than
// the head, it streams; an event less than its Content-Length, it goes
// to the client chunked, whole.
func TestAnSSEReplyOfKnownLengthWithoutItsUsageIsSentChunked(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{{"Content-Type", "text/event-stream"}},
		Body: sseWithUsage(strings.Repeat("a", 40<<10))})
	h := budgeted(t, up.URL, TokenLimits{TokensPerMinute: 100000})
	req := asking(20, true)
	resp, err := testClient.Post(h.url+"/v1/chat/completions", "application/json", strings.NewReader(req))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Errorf("client read failed: %v (Content-Length %d, got %d bytes)", err, resp.ContentLength, len(b))
	}
}

// TestAKeysOwnLimitTakesOnlyTheFirstCredentialEntrysPlace: of two
// entries keyed by credential (a request limit, a token budget), a key
// with its own requests_per_second replaces the first; the second's
// budget holds it still.
func TestAKeysOwnLimitTakesOnlyTheFirstCredentialEntrysPlace(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, chatUsage(10, 500))
	h := startProxy(t, up.URL, func(o *Options) {
		o.Clients = []ClientLimit{{RequestsPerSecond: 1000}, {TokenLimits: TokenLimits{TokensPerMinute: 100}}}
		o.ClientKeys = []ClientKey{{Key: "k", RequestsPerSecond: 500}}
	})
	var codes []int
	for range 3 {
		resp, _ := h.chat(asking(500, false), "Authorization", "Bearer k")
		codes = append(codes, resp.StatusCode)
	}
	if fmt.Sprint(codes) != "[200 429 429]" { // the second entry's budget holds the key too
		t.Fatalf("statuses %v", codes)
	}
}

// TestTheMeterEndsALongEventOfCRLFLines: an event over meterHold ends
// at its blank line however its lines end (sse-starlette writes CRLF);
// the events after it are metered as events.
func TestTheMeterEndsALongEventOfCRLFLines(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 3*meterHold)
	ev := func(s string) string { return "data: {\"choices\":[{\"delta\":{\"content\":\"" + s + "\"}}]}\r\n\r\n" }
	body := ev(long)
	for range 100 {
		body += ev("ab")
	}
	var m meter
	m.start(policy.APIChat, events.SSE)
	for b := []byte(body); len(b) > 0; {
		n := min(4096, len(b))
		m.feed(b[:n])
		b = b[n:]
	}
	m.end()
	want := textTokens(len(long) + 200)
	if got := m.result().streamed; got > want+50 {
		t.Errorf("streamed %d tokens, want about %d", got, want)
	}
}

// TestAFollowedStreamsLastEventWithoutItsBlankLineIsFollowed: the last
// event of a stream followed for its usage, without its blank line, is
// metered and its usage chunk not relayed.
func TestAFollowedStreamsLastEventWithoutItsBlankLineIsFollowed(t *testing.T) {
	t.Parallel()
	first := `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"hello"}}]}` + "\n\n"
	last := strings.TrimSuffix(usageChunkSSE, "\n\n") + "\n"
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{{"Content-Type", "text/event-stream"}}, Chunks: []string{first, last}})
	h := budgeted(t, up.URL, TokenLimits{TokensPerMinute: 1000})
	_, body := h.chat(asking(20, true), "Authorization", "Bearer k")
	if strings.Contains(string(body), `"usage":{`) {
		t.Errorf("usage chunk relayed to a client that did not ask: %q", body)
	}
	up.SetScript(chatUsage(0, 0))
	if got := remaining(t, h, 1000, "k"); got != 1000-18 {
		t.Errorf("remaining %d, want %d", got, 1000-18)
	}
}

// TestAContinuationsUsageIsNotShown: a stream continued on a target
// Sturdy asks for usage (its primary, stream_usage: false, was not)
// relays no usage chunk.
func TestAContinuationsUsageIsNotShown(t *testing.T) {
	t.Parallel()
	primary := upstreamtest.Start(t, cutAfter(upstreamtest.Cut, "Hel", "lo"))
	cont := continuationOf(" wor", "ld")
	cont.Chunks = append(cont.Chunks[:len(cont.Chunks)-1], usageChunkSSE, "data: [DONE]\n\n")
	fallback := upstreamtest.Start(t, cont)
	off := false
	h := startRescue(t, primary, fallback, upstream.ContinuePrefill, func(o *Options) {
		o.Upstreams[0].StreamUsage = &off
		o.Clients = []ClientLimit{{TokenLimits: TokenLimits{TokensPerMinute: 100000}}}
	})
	resp, body := h.chat(streamChat, "Authorization", "Bearer k")
	if !strings.Contains(string(body), "wor") {
		t.Fatalf("not continued: %d %q", resp.StatusCode, body)
	}
	if strings.Contains(string(body), `"usage":{`) {
		t.Errorf("usage chunk relayed to a client that did not ask")
	}
}

// TestARescuedStreamSettlesItsTextAndTheContinuationsUsage: the cut
// attempt is charged what it streamed ÷ 4, the continuation its usage.
func TestARescuedStreamSettlesItsTextAndTheContinuationsUsage(t *testing.T) {
	t.Parallel()
	primary := upstreamtest.Start(t, cutAfter(upstreamtest.Cut, strings.Repeat("a", 40), strings.Repeat("b", 40))) // 80 characters: 20 tokens
	cont := continuationOf(" wor", "ld")
	cont.Chunks = append(cont.Chunks[:len(cont.Chunks)-1], usageChunkSSE, "data: [DONE]\n\n") // 7 + 11
	fallback := upstreamtest.Start(t, cont)
	h := startRescue(t, primary, fallback, upstream.ContinuePrefill, func(o *Options) {
		o.Clients = []ClientLimit{{TokenLimits: TokenLimits{TokensPerMinute: 1000}}}
	})
	resp, body := h.chat(streamChat, "Authorization", "Bearer k")
	if !strings.Contains(string(body), "wor") || strings.Contains(string(body), `"usage":{`) {
		t.Fatalf("not continued, or its usage shown: %d %q", resp.StatusCode, body)
	}
	primary.SetScript(chatUsage(0, 0))
	if got := remaining(t, h, 1000, "k"); got != 1000-20-18 {
		t.Fatalf("remaining %d, want %d", got, 1000-20-18)
	}
}

// TestADeeplyNestedBodyIsEstimatedInLinearTime: a 200 KB body whose
// messages nest 100,000 arrays deep, on a route with a token budget, is
// estimated in one pass — past policy.MaxTextDepth every byte counts as a
// character — and answered at once. Before, each level re-parsed the
// rest of the body: 14 s of CPU (and 178 s for 900 KB, after its client
// had left).
func TestADeeplyNestedBodyIsEstimatedInLinearTime(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, chatUsage(10, 10))
	h := budgeted(t, up.URL, TokenLimits{TokensPerMinute: 10_000_000})
	const levels = 100_000
	body := `{"model":"m","max_tokens":10,"messages":` + strings.Repeat("[", levels) + `"abc"` + strings.Repeat("]", levels) + `}`
	done := make(chan string, 1)
	go func() {
		resp, err := testClient.Post(h.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			done <- err.Error()
			return
		}
		resp.Body.Close()
		done <- resp.Status
	}()
	select {
	case status := <-done:
		if status != "200 OK" {
			t.Fatalf("status %s", status)
		}
	case <-time.After(5 * time.Second): // the linear walk takes a millisecond; the quadratic one took 14 s
		t.Fatal("the estimate of a deeply nested body did not end within 5 s")
	}
}

// upstreamWindow is the tokens_per_minute window of h's first upstream.
func upstreamWindow(t *testing.T, h *harness) upstream.TokenWindowStatus {
	t.Helper()
	st := h.p.Upstreams()[0].TokensPerMinute
	if len(st) == 0 {
		t.Fatal("no tokens_per_minute window")
	}
	return st[0]
}

// TestOneRequestsMaxTokensDoesNotHoldASharedWindow: a request asking
// max_tokens 10¹² of an upstream paced at 1,000 tokens a minute reserves
// at most a quarter of the window, so the other clients' requests go on
// while its reply runs. Before, it reserved 10¹² + 1 tokens and every
// other request waited, then got 429, for as long as it streamed.
func TestOneRequestsMaxTokensDoesNotHoldASharedWindow(t *testing.T) {
	t.Parallel()
	var held atomic.Int32
	slow, release := heldUpstream(t, &held)
	h := startProxy(t, slow, func(o *Options) {
		o.Upstreams[0].TokensPerMinute = map[string]int64{"*": 1000}
		o.Upstreams[0].RateLimit.MaxWait = 100 * time.Millisecond
	})
	greedy := make(chan int, 1)
	go func() {
		resp, err := testClient.Post(h.url+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","max_tokens":1000000000000,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			greedy <- 0
			return
		}
		resp.Body.Close()
		greedy <- resp.StatusCode
	}()
	waitFor(t, 2*time.Second, "the greedy request at the upstream", func() bool { return held.Load() == 1 })
	if w := upstreamWindow(t, h); w.Reserved > 1+250 { // its text, and a quarter of the window
		t.Fatalf("the greedy request holds %d of the window's 1,000 tokens", w.Reserved)
	}
	others := make(chan int, 3)
	for range 3 {
		go func() {
			resp, err := testClient.Post(h.url+"/v1/chat/completions", "application/json", strings.NewReader(asking(20, false)))
			if err != nil {
				others <- 0
				return
			}
			resp.Body.Close()
			others <- resp.StatusCode
		}()
	}
	waitFor(t, 2*time.Second, "the other requests at the upstream", func() bool { return held.Load() == 4 })
	close(release)
	for range 3 {
		if s := <-others; s != 200 {
			t.Errorf("another client's request: %d", s)
		}
	}
	if s := <-greedy; s != 200 {
		t.Errorf("the greedy request: %d", s)
	}
}

// TestARequestInTheQueueHoldsNoTokens: a request waiting in a
// concurrency queue holds none of its upstream's tokens_per_minute; it
// reserves once it has its place. Before, the reservation was taken
// before the queue and held for its whole wait.
func TestARequestInTheQueueHoldsNoTokens(t *testing.T) {
	t.Parallel()
	var held atomic.Int32
	slow, release := heldUpstream(t, &held)
	h := startProxy(t, slow, func(o *Options) {
		o.Upstreams[0].TokensPerMinute = map[string]int64{"*": 1000}
		o.Upstreams[0].Concurrency = upstream.Concurrency{Mode: upstream.ConcurrencyFixed, Max: 1, Queue: upstream.Queue{Max: 4}}
		o.Upstreams[0].QueueTimeout = 5 * time.Second
	})
	done := make(chan int, 2)
	for range 2 {
		go func() {
			resp, err := testClient.Post(h.url+"/v1/chat/completions", "application/json", strings.NewReader(asking(20, false)))
			if err != nil {
				done <- 0
				return
			}
			resp.Body.Close()
			done <- resp.StatusCode
		}()
	}
	waitFor(t, 2*time.Second, "one at the upstream, one queued", func() bool {
		st := endpointConcurrency(t, h)
		return held.Load() == 1 && st.Queued[0] == 1
	})
	if w := upstreamWindow(t, h); w.Reserved != 21 { // one estimate: 1 + 20
		t.Fatalf("the window holds %d tokens, want 21: the queued request reserved before its place", w.Reserved)
	}
	close(release)
	for range 2 {
		if s := <-done; s != 200 {
			t.Errorf("status %d", s)
		}
	}
}

// TestOneCredentialIsOneClientWhicheverHeaderCarriesIt: the same key sent
// as x-api-key and as Authorization: Bearer is one client — one rate
// limit, one token budget, one line of /debug/clients. Before, each
// header was a client of its own: 8 of 8 through a burst of 4 by
// alternating them.
func TestOneCredentialIsOneClientWhicheverHeaderCarriesIt(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, chatUsage(1, 1))
	h := startProxy(t, up.URL, func(o *Options) {
		o.AuthKeys = []string{"sk-team"}
		o.Clients = []ClientLimit{{RequestsPerSecond: 0.001, Burst: 4, TokenLimits: TokenLimits{TokensPerMinute: 1_000_000}}}
	})
	admitted := 0
	for i := range 8 {
		header := []string{"Authorization", "Bearer sk-team"}
		if i%2 == 1 {
			header = []string{"X-Api-Key", "sk-team"}
		}
		if resp, _ := h.chat("", header...); resp.StatusCode == 200 {
			admitted++
		}
	}
	if admitted != 4 {
		t.Fatalf("%d of 8 admitted through a burst of 4", admitted)
	}
	if page := h.p.Clients(1, 10); page.Total != 1 {
		t.Fatalf("/debug/clients lists %d clients, want the one key once", page.Total)
	}
}

// TestInventedCredentialsDoNotLockOthersOutOfBudgets: budgets of clients
// not authenticated are bounded per source address, so credentials
// invented from one address fill no more than MaxBudgetsPerSource places
// and a new client from elsewhere — or an authenticated one — still
// gets its budget. Before, 100,010 invented credentials filled the
// 100,000 places and every new client got 429 for about a minute.
func TestInventedCredentialsDoNotLockOthersOutOfBudgets(t *testing.T) {
	t.Parallel()
	cl := newClientLimiter(ClientLimit{KeyHeader: DefaultKeyHeader, TokenLimits: TokenLimits{TokensPerMinute: 1000}}.withDefaults(), nil)
	now := time.Now()
	const flood, other = 11, 22
	for i := range MaxBudgetsPerSource {
		key := []byte(fmt.Sprint("sk-invented-", i))
		b, _ := cl.budgetOf(credHash(key), key, flood, now)
		if b == nil {
			t.Fatalf("budget %d refused", i)
		}
		b.w[tokensTotal].Reserve(10, now) // in use: never idle
	}
	if b, why := cl.budgetOf(credHash([]byte("sk-one-more")), []byte("sk-one-more"), flood, now); b != nil || !strings.Contains(why, "one address") {
		t.Fatalf("past the source's bound: %v %q", b, why)
	}
	for _, src := range []uint64{other, 0} {
		if b, why := cl.budgetOf(credHash([]byte(fmt.Sprint("sk-real-", src))), []byte("sk-real"), src, now); b == nil {
			t.Fatalf("a client from source %d was refused: %s", src, why)
		}
	}
	cl.budgets.Remove(credHash([]byte("sk-invented-0"))) // a place of the flood's freed
	if b, _ := cl.budgetOf(credHash([]byte("sk-one-more")), []byte("sk-one-more"), flood, now); b == nil {
		t.Fatal("a freed place was not counted back")
	}
}

// TestInventedCredentialsFromOneAddressAreBounded is the bound over
// loopback: the invented credentials of 127.0.0.2 past the bound get 429,
// a client from 127.0.0.3 its answer.
func TestInventedCredentialsFromOneAddressAreBounded(t *testing.T) {
	t.Parallel()
	var held atomic.Int32
	slow, release := heldUpstream(t, &held)
	h := startProxy(t, slow, func(o *Options) {
		o.Clients = []ClientLimit{{TokenLimits: TokenLimits{TokensPerMinute: 1_000_000}}}
		o.Upstreams[0].MaxConnections = 2 * MaxBudgetsPerSource
	})
	flood := clientFrom("127.0.0.2")
	flood.Transport.(*http.Transport).MaxConnsPerHost = 0
	results := make(chan int, MaxBudgetsPerSource+1)
	for i := range MaxBudgetsPerSource { // each held at the upstream: its budget in use
		go func() { results <- postFrom(flood, h.url, fmt.Sprint("sk-invented-", i)) }()
	}
	waitFor(t, 20*time.Second, "the flood at the upstream", func() bool { return held.Load() == MaxBudgetsPerSource })
	if s := postFrom(flood, h.url, "sk-invented-more"); s != 429 {
		t.Fatalf("one more invented credential from the same address: %d, want 429", s)
	}
	realDone := make(chan int, 1)
	go func() { realDone <- postFrom(clientFrom("127.0.0.3"), h.url, "sk-real") }()
	waitFor(t, 5*time.Second, "the real client at the upstream", func() bool { return held.Load() == MaxBudgetsPerSource+1 })
	close(release)
	if s := <-realDone; s != 200 {
		t.Fatalf("a client from another address: %d", s)
	}
	for range MaxBudgetsPerSource {
		<-results
	}
}
