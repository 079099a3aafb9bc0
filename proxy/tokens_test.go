package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"sturdy/internal/upstreamtest"
)

// chatUsage is a chat completion whose usage is in and out tokens.
func chatUsage(in, out int) upstreamtest.Step {
	return upstreamtest.Step{Header: [][2]string{{"Content-Type", "application/json"}},
		Body: fmt.Sprintf(`{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d}}`, in, out)}
}

// budgeted is a proxy whose clients each have tokens_per_minute limit.
func budgeted(t *testing.T, url string, limits TokenLimits) *harness {
	return startProxy(t, url, func(o *Options) { o.Clients = []ClientLimit{{TokenLimits: limits}} })
}

// asking is a chat body of 4 characters of text asking for at most max
// tokens (0: no max_tokens), streamed when stream.
func asking(max int, stream bool) string {
	b := `{"model":"m","messages":[{"role":"user","content":"abcd"}]`
	if max > 0 {
		b += `,"max_tokens":` + strconv.Itoa(max)
	}
	if stream {
		b += `,"stream":true`
	}
	return b + "}"
}

// remaining is what the token budget of limit tokens a minute holds
// for key now, as /debug/clients tells it: the whole limit for a key
// never charged. The budget is read, not spent.
func remaining(t *testing.T, h *harness, limit int, key string) int {
	t.Helper()
	return budgetLeft(h, tokenKindNames[tokensTotal], limit, key)
}

// budgetLeft is remaining for the budget of kind (its name in
// /debug/clients).
func budgetLeft(h *harness, kind string, limit int, key string) int {
	sum := sha256.Sum256([]byte(key))
	id := hex.EncodeToString(sum[:6])
	for _, c := range h.p.Clients(1, MaxClientsPerPage).Clients {
		for _, b := range c.Budgets {
			if c.Key == id && b.Kind == kind {
				return int(b.Remaining)
			}
		}
	}
	return limit
}

// TestATokenBudgetSettlesToUsageAndRefusesItsDebt: a request reserves
// its estimate, settles to the reply's usage, and once the balance is
// spent (or owed) the next is refused with the budget's headers and a
// Retry-After of when spend leaves the minute.
func TestATokenBudgetSettlesToUsageAndRefusesItsDebt(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, chatUsage(10, 50))
	h := budgeted(t, up.URL, TokenLimits{TokensPerMinute: 100})
	for i := range 2 { // estimates 1 + 20: 0 and 60 spent allow them
		if resp, body := h.chat(asking(20, false), "Authorization", "Bearer k"); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	resp, body := h.chat(asking(20, false), "Authorization", "Bearer k") // 120 spent: 20 owed
	if resp.StatusCode != 429 {
		t.Fatalf("over the budget: %d %s", resp.StatusCode, body)
	}
	code, _ := errorOf(t, body)
	ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	if code != CodeRateLimited || !strings.Contains(string(body), "out of tokens") || ra < 55 || ra > 66 ||
		resp.Header.Get("x-ratelimit-limit-tokens") != "100" || resp.Header.Get("x-ratelimit-remaining-tokens") != "0" ||
		resp.Header.Get("x-ratelimit-reset-tokens") == "" {
		t.Fatalf("refusal: %v %s", resp.Header, body)
	}
	if resp, _ := h.chat(asking(20, false), "Authorization", "Bearer other"); resp.StatusCode != 200 {
		t.Fatalf("another key's budget is its own: %d", resp.StatusCode)
	}
	if up.Count() != 3 {
		t.Fatalf("upstream saw %d requests", up.Count())
	}
	if in, out := testutil.ToFloat64(h.p.m.Tokens.WithLabelValues("default", "up", "other", "input")),
		testutil.ToFloat64(h.p.m.Tokens.WithLabelValues("default", "up", "other", "output")); in != 30 || out != 150 {
		t.Fatalf("sturdy_tokens_total input %v output %v", in, out)
	}
}

// TestConcurrentRequestsReserveBeforeTheySpend: five requests at once of
// 31 tokens each against 100 a minute — three go, two are refused
// (counting after the fact let all five through: LiteLLM #18730).
func TestConcurrentRequestsReserveBeforeTheySpend(t *testing.T) {
	t.Parallel()
	step := chatUsage(1, 30)
	step.Delay = 300 * time.Millisecond // all five are in flight together
	up := upstreamtest.Start(t, step)
	h := budgeted(t, up.URL, TokenLimits{TokensPerMinute: 100})
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for range 5 {
		wg.Go(func() {
			resp, _ := h.chat(asking(30, false), "Authorization", "Bearer k")
			mu.Lock()
			codes[resp.StatusCode]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes[200] != 3 || codes[429] != 2 {
		t.Fatalf("statuses %v", codes)
	}
	if got := remaining(t, h, 100, "k"); got != 100-3*31 {
		t.Fatalf("remaining %d, want %d", got, 100-3*31)
	}
}

// TestTokenBudgetCases: what is charged, what is refunded, and the
// budgets of one side.
func TestTokenBudgetCases(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		step   upstreamtest.Step
		limits TokenLimits
		path   string
		body   string
		// left is what the budget keeps of 1000 after the request.
		left int
	}{
		{"usage", chatUsage(100, 200), TokenLimits{TokensPerMinute: 1000}, "/v1/chat/completions", asking(20, false), 700},
		{"input budget", chatUsage(100, 200), TokenLimits{InputTokensPerMinute: 1000}, "/v1/chat/completions", asking(20, false), 900},
		{"output budget", chatUsage(100, 200), TokenLimits{OutputTokensPerMinute: 1000}, "/v1/chat/completions", asking(20, false), 800},
		{"an upstream's 400: refunded", upstreamtest.Step{Status: 400, Body: `{"error":{"message":"bad","type":"invalid_request_error"}}`},
			TokenLimits{TokensPerMinute: 1000}, "/v1/chat/completions", asking(20, false), 1000},
		{"a reply without usage: its input estimate and text", upstreamtest.Step{Header: [][2]string{{"Content-Type", "application/json"}},
			Body: `{"choices":[{"message":{"content":"abcdefgh"}}]}`}, TokenLimits{TokensPerMinute: 1000}, "/v1/chat/completions", asking(20, false), 997},
		{"count_tokens is free", upstreamtest.Step{Body: `{"input_tokens":5}`}, TokenLimits{TokensPerMinute: 1000},
			"/v1/messages/count_tokens", `{"model":"m","max_tokens":900,"messages":[{"role":"user","content":"abcd"}]}`, 1000},
		{"a model list is free", upstreamtest.Step{Body: `{"data":[]}`}, TokenLimits{TokensPerMinute: 1000}, "/v1/models", "", 1000},
		{"ollama", upstreamtest.Step{Body: `{"model":"llama3","done":true,"prompt_eval_count":26,"eval_count":290}`},
			TokenLimits{TokensPerMinute: 1000}, "/api/chat", `{"model":"llama3","messages":[{"role":"user","content":"abcd"}],"stream":false}`, 684},
		{"responses", upstreamtest.Step{Body: `{"model":"o3","usage":{"input_tokens":40,"output_tokens":2}}`},
			TokenLimits{TokensPerMinute: 1000}, "/v1/responses", `{"model":"o3","input":"abcd"}`, 958},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			up := upstreamtest.Start(t, c.step)
			h := budgeted(t, up.URL, c.limits)
			method := "POST"
			if c.body == "" {
				method = "GET"
			}
			if resp, body := h.do(method, c.path, c.body, "Authorization", "Bearer k", "Content-Type", "application/json"); resp.StatusCode != c.step.Status && resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			up.SetScript(chatUsage(0, 0))
			if got := remainingOf(t, h, c.limits, "k"); got != c.left {
				t.Fatalf("left %d, want %d", got, c.left)
			}
		})
	}
}

// remainingOf is remaining for a budget of limits: of the kind it sets.
func remainingOf(t *testing.T, h *harness, l TokenLimits, key string) int {
	t.Helper()
	switch {
	case l.InputTokensPerMinute > 0:
		return budgetLeft(h, tokenKindNames[tokensInput], int(l.InputTokensPerMinute), key)
	case l.OutputTokensPerMinute > 0:
		return budgetLeft(h, tokenKindNames[tokensOutput], int(l.OutputTokensPerMinute), key)
	}
	return remaining(t, h, int(l.TokensPerMinute), key)
}

// TestASmallBudgetAdmitsARequestLargerThanItself: a 100-token key's
// request for 500 goes when its balance is full, then is a debt.
func TestASmallBudgetAdmitsARequestLargerThanItself(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, chatUsage(1, 400))
	h := budgeted(t, up.URL, TokenLimits{TokensPerMinute: 100})
	if resp, body := h.chat(asking(500, false), "Authorization", "Bearer k"); resp.StatusCode != 200 {
		t.Fatalf("first request: %d %s", resp.StatusCode, body)
	}
	if resp, _ := h.chat(asking(1, false), "Authorization", "Bearer k"); resp.StatusCode != 429 {
		t.Fatalf("in debt: %d", resp.StatusCode)
	}
}

// TestAStreamsUsageIsAskedForAndNotShown: a chat stream whose client did
// not ask for its usage is sent with stream_options.include_usage, the
// usage chunk is not relayed, and the budget settles to it exactly; a
// client that asked gets it; stream_usage: false leaves the body alone.
func TestAStreamsUsageIsAskedForAndNotShown(t *testing.T) {
	t.Parallel()
	chunks := upstreamtest.SSE("Hello", " world")
	usageChunk := `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":11}}` + "\n\n"
	chunks = append(chunks[:len(chunks)-1], usageChunk, chunks[len(chunks)-1])
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{{"Content-Type", "text/event-stream"}}, Chunks: chunks})
	h := budgeted(t, up.URL, TokenLimits{TokensPerMinute: 1000})
	resp, body := h.chat(asking(20, true), "Authorization", "Bearer k")
	if resp.StatusCode != 200 || strings.Contains(string(body), `"usage":{`) || !strings.Contains(string(body), "world") ||
		!strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	var sent struct {
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.Unmarshal(up.Requests()[0].Body, &sent); err != nil || !sent.StreamOptions.IncludeUsage {
		t.Fatalf("upstream got %s", up.Requests()[0].Body)
	}
	_, body = h.chat(`{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true}}`, "Authorization", "Bearer k")
	if !strings.Contains(string(body), `"completion_tokens":11`) {
		t.Fatalf("a client that asked for its usage: %q", body)
	}
	if got := remaining(t, h, 1000, "k"); got != 1000-2*18 {
		t.Fatalf("remaining %d, want %d", got, 1000-2*18)
	}

	off := false
	h = startProxy(t, up.URL, func(o *Options) {
		o.Clients = []ClientLimit{{TokenLimits: TokenLimits{TokensPerMinute: 1000}}}
		o.Upstreams[0].StreamUsage = &off
	})
	h.chat(asking(20, true), "Authorization", "Bearer k")
	if got := up.Requests()[len(up.Requests())-1].Body; strings.Contains(string(got), "stream_options") {
		t.Fatalf("stream_usage false: upstream got %s", got)
	}
}

// TestAStreamCutBeforeItsUsageSettlesByItsText: the streamed characters
// ÷ 4, and the input's estimate.
func TestAStreamCutBeforeItsUsageSettlesByItsText(t *testing.T) {
	t.Parallel()
	chunks := upstreamtest.SSE(strings.Repeat("a", 400)) // 100 tokens of text
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{{"Content-Type", "text/event-stream"}},
		Chunks: chunks[:1], Fault: upstreamtest.Cut})
	h := budgeted(t, up.URL, TokenLimits{TokensPerMinute: 1000})
	h.chat(asking(20, true), "Authorization", "Bearer k")
	up.SetScript(chatUsage(0, 0))
	if got := remaining(t, h, 1000, "k"); got != 1000-101 {
		t.Fatalf("remaining %d, want %d", got, 1000-101)
	}
}

// TestAnAnthropicRequestOverItsBudget is refused in the Messages API's
// shape, with anthropic-ratelimit-*-tokens headers.
func TestAnAnthropicRequestOverItsBudget(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: `{"type":"message","model":"claude","content":[{"type":"text","text":"ok"}],"usage":{"input_tokens":30,"cache_read_input_tokens":20,"output_tokens":60}}`})
	h := budgeted(t, up.URL, TokenLimits{InputTokensPerMinute: 40})
	body := `{"model":"claude","max_tokens":100,"messages":[{"role":"user","content":"abcd"}]}`
	for i, want := range []int{200, 429} { // 50 input tokens (cache reads count): the second is refused
		resp, got := h.do("POST", "/v1/messages", body, "x-api-key", "k", "Content-Type", "application/json")
		if resp.StatusCode != want {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, got)
		}
		if want == 429 && (!strings.Contains(string(got), `"rate_limit_error"`) || resp.Header.Get("anthropic-ratelimit-input-tokens-limit") != "40" ||
			resp.Header.Get("anthropic-ratelimit-input-tokens-remaining") != "0" || resp.Header.Get("anthropic-ratelimit-input-tokens-reset") == "") {
			t.Fatalf("refusal %v %s", resp.Header, got)
		}
	}
}

// TestAReloadKeepsWhatABudgetSpent: a changed tokens_per_minute — a
// clients: entry's, a client key's own — applies to what was spent
// before it.
func TestAReloadKeepsWhatABudgetSpent(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		budget func(o *Options, limit int64)
	}{
		{"clients: entry", func(o *Options, limit int64) {
			o.Clients = []ClientLimit{{TokenLimits: TokenLimits{TokensPerMinute: limit}}}
		}},
		{"a key's own", func(o *Options, limit int64) {
			o.ClientKeys = []ClientKey{{Key: "k", TokenLimits: TokenLimits{TokensPerMinute: limit}}}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			up := upstreamtest.Start(t, chatUsage(100, 200))
			var opts Options
			h := startProxy(t, up.URL, func(o *Options) {
				c.budget(o, 1000)
				opts = *o
			})
			if resp, _ := h.chat(asking(20, false), "Authorization", "Bearer k"); resp.StatusCode != 200 {
				t.Fatalf("%d", resp.StatusCode)
			}
			c.budget(&opts, 2000)
			if _, err := h.p.Reload(opts); err != nil {
				t.Fatal(err)
			}
			up.SetScript(chatUsage(0, 0))
			if got := remaining(t, h, 2000, "k"); got != 1700 {
				t.Fatalf("remaining %d after the reload, want 1700", got)
			}
		})
	}
}

// TestAnUpstreamsTokensPerMinutePacesItsModels: a model glob's window
// takes each request's estimate when its target is chosen and settles to
// the usage; once it cannot, the request goes to the fallback — or, with
// none, is refused 429 — and a request that fails over gives its
// reservation back.
func TestAnUpstreamsTokensPerMinutePacesItsModels(t *testing.T) {
	t.Parallel()
	paced := upstreamtest.Start(t, chatUsage(10, 50))
	other := upstreamtest.Start(t, chatUsage(1, 1))
	tpm := func(o *Options) { o.Upstreams[0].TokensPerMinute = map[string]int64{"m*": 100, "*": 1 << 30} }
	h := startProxy(t, paced.URL, func(o *Options) {
		tpm(o)
		o.Upstreams = append(o.Upstreams, testUpstream("other", other.URL))
		o.Routes[0].Fallbacks = []Target{{Upstream: "other"}}
	})
	var by []string
	for range 3 { // 0, then 60 spent take an estimate of 21; 120 does not
		resp, body := h.chat(asking(20, false))
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		by = append(by, resp.Header.Get("X-Sturdy-Upstream"))
	}
	if strings.Join(by, ",") != "up,up,other" {
		t.Fatalf("answered by %v", by)
	}
	if resp, _ := h.chat(strings.Replace(asking(20, false), `"m"`, `"n"`, 1)); resp.Header.Get("X-Sturdy-Upstream") != "up" {
		t.Fatalf("another glob's window is its own: %v", resp.Header)
	}

	alone := startProxy(t, paced.URL, tpm)
	for i, want := range []int{200, 200, 429} {
		resp, body := alone.chat(asking(20, false))
		if resp.StatusCode != want {
			t.Fatalf("request %d without a fallback: %d %s", i, resp.StatusCode, body)
		}
		if want == 429 && resp.Header.Get("Retry-After") == "" {
			t.Fatalf("no Retry-After: %v", resp.Header)
		}
	}
}

// TestAFailedOverRequestGivesItsTokensBack: the reservation on a target
// that failed goes back; the fallback's reply is not charged to it.
func TestAFailedOverRequestGivesItsTokensBack(t *testing.T) {
	t.Parallel()
	failing := upstreamtest.Start(t, upstreamtest.Step{Status: 500})
	other := upstreamtest.Start(t, chatUsage(1, 1))
	h := startProxy(t, failing.URL, func(o *Options) {
		o.Upstreams[0].TokensPerMinute = map[string]int64{"*": 100}
		o.Upstreams = append(o.Upstreams, testUpstream("other", other.URL))
		o.Routes[0].Fallbacks = []Target{{Upstream: "other"}}
		o.Routes[0].Retry.MaxAttempts = 1
	})
	for i := range 6 { // 6 × 21 > 100: each is given back
		if resp, body := h.chat(asking(20, false)); resp.StatusCode != 200 || resp.Header.Get("X-Sturdy-Upstream") != "other" {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	if got := failing.Count(); got != 6 {
		t.Fatalf("the paced upstream saw %d requests: its window kept failed reservations", got)
	}
}

// TestDebugClientsListsBudgetsMostUsedFirst: each client by its key's
// SHA-256 prefix (never the key), its budgets, the most used first, a
// page at a time.
func TestDebugClientsListsBudgetsMostUsedFirst(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, chatUsage(10, 50))
	h := budgeted(t, up.URL, TokenLimits{TokensPerMinute: 1000})
	for i, key := range []string{"sk-a", "sk-b", "sk-b", "sk-c"} {
		if resp, _ := h.chat(asking(20, false), "Authorization", "Bearer "+key); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	page := h.p.Clients(1, 2)
	b, _ := json.Marshal(page)
	sum := sha256.Sum256([]byte("sk-b"))
	if page.Total != 3 || len(page.Clients) != 2 || page.Clients[0].Key != hex.EncodeToString(sum[:6]) ||
		page.Clients[0].Use != 120 || page.Clients[0].Entry != "clients[0]" || page.Clients[0].Budgets[0].Remaining != 880 ||
		strings.Contains(string(b), "sk-") {
		t.Fatalf("page 1: %s", b)
	}
	if last := h.p.Clients(2, 2); len(last.Clients) != 1 || last.Clients[0].Use != 60 {
		t.Fatalf("page 2: %+v", last)
	}
	for _, page := range []int{9, 1 << 62} {
		if past := h.p.Clients(page, 2); len(past.Clients) != 0 {
			t.Fatalf("page %d, past the end: %+v", page, past)
		}
	}
}

// TestASpendBudgetRefusesUntilThePeriodEnds: replies priced by the
// model as sent add to the client's spend; once it reached its budget the
// client is refused 429 budget_exceeded, not to be retried, until the UTC
// day ends; sturdy_spend_usd_total counts the cost.
func TestASpendBudgetRefusesUntilThePeriodEnds(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, chatUsage(5, 20)) // $0.45, then $1.10: the second passes the budget
	h := startProxy(t, up.URL, func(o *Options) {
		o.Prices = map[string]Price{"*": {Input: 1, Output: 1}, "m": {Input: 10000, Output: 20000}} // m: $0.01 in, $0.02 out a token
		o.Clients = []ClientLimit{{Spend: Spend{USD: 1}}}
	})
	for i := range 2 { // under $1 before each
		if resp, body := h.chat(asking(20, false), "Authorization", "Bearer k"); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
		up.SetScript(chatUsage(10, 50))
	}
	resp, body := h.chat(asking(20, false), "Authorization", "Bearer k")
	code, _ := errorOf(t, body)
	ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	now := time.Now().UTC()
	toMidnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC).Sub(now)
	if resp.StatusCode != 429 || code != CodeBudgetExceeded || resp.Header.Get("x-should-retry") != "false" ||
		time.Duration(ra)*time.Second < toMidnight-time.Minute || time.Duration(ra)*time.Second > toMidnight+time.Minute {
		t.Fatalf("over the spend: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if got := testutil.ToFloat64(h.p.m.RateLimited.WithLabelValues("client_spend")); got != 1 {
		t.Fatalf("sturdy_rate_limited_total{reason=client_spend} %v", got)
	}
	if got := testutil.ToFloat64(h.p.m.Spend.WithLabelValues("default", "up", "m")); got < 1.549 || got > 1.551 {
		t.Fatalf("sturdy_spend_usd_total %v, want 1.55", got)
	}
	if resp, _ := h.chat(asking(20, false), "Authorization", "Bearer other"); resp.StatusCode != 200 {
		t.Fatalf("another client's spend is its own: %d", resp.StatusCode)
	}
}

// TestASpenderWithoutTokensHeldMayLeaveTheMap: what a client spent does
// not pin its budget in the bounded map (that would shut new clients out
// until the period's end); tokens held or owed do.
func TestASpenderWithoutTokensHeldMayLeaveTheMap(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := newKeyBudget(TokenLimits{TokensPerMinute: 100}, []byte("k"))
	n, _ := periodOf("day", now)
	b.spent.add(n, 5)
	if !b.idle(now) {
		t.Fatal("a client that only spent is kept")
	}
	b.w[tokensTotal].Reserve(10, now)
	if b.idle(now) {
		t.Fatal("a client holding tokens may leave")
	}
}
