package proxy

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sturdy/breaker"
	"sturdy/internal/upstreamtest"
	"sturdy/policy"
	"sturdy/upstream"
)

// withFallbacks adds upstreams named b, c … for the given URLs as the
// default route's fallbacks, with optional model rewrites.
func withFallbacks(o *Options, urls []string, models ...string) {
	for i, u := range urls {
		name := string(rune('b' + i))
		o.Upstreams = append(o.Upstreams, testUpstream(name, u))
		t := Target{Upstream: name}
		if i < len(models) {
			t.Model = models[i]
		}
		o.Routes[0].Fallbacks = append(o.Routes[0].Fallbacks, t)
	}
	o.Routes[0].Retry.MaxTotalAttempts = o.Routes[0].Retry.MaxAttempts + len(urls)
}

func TestFailoverRewritesOnlyTheModel(t *testing.T) {
	t.Parallel()
	primary := upstreamtest.Start(t, upstreamtest.Step{Status: 503})
	fallback := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.JSONHeader}, Body: `{"model":"llama3.1"}`})
	h := startProxy(t, primary.URL, func(o *Options) {
		o.Routes[0].Retry.MaxAttempts = 2
		withFallbacks(o, []string{fallback.URL}, "llama3.1")
	})
	body := `{ "messages":[{"role":"user","content":"hi \u00e9"}],  "model" : "gpt-4o",  "temperature":0.5 }`
	resp, got := h.chat(body)
	if resp.StatusCode != 200 || string(got) != `{"model":"llama3.1"}` || resp.Header.Get("X-Sturdy-Upstream") != "b" {
		t.Fatalf("got %d %q upstream=%q", resp.StatusCode, got, resp.Header.Get("X-Sturdy-Upstream"))
	}
	if primary.Count() != 2 || fallback.Count() != 1 {
		t.Fatalf("primary %d, fallback %d requests", primary.Count(), fallback.Count())
	}
	want := strings.Replace(body, `"gpt-4o"`, `"llama3.1"`, 1)
	if sent := string(fallback.Requests()[0].Body); sent != want {
		t.Fatalf("fallback got body\n%s\nwant\n%s", sent, want)
	}
	if sent := string(primary.Requests()[0].Body); sent != body {
		t.Fatalf("primary got a changed body %s", sent)
	}
	targets := h.accessLines(1)[0]["targets"].([]any)
	if len(targets) != 2 || targets[0].(map[string]any)["result"] != "5xx" || targets[0].(map[string]any)["attempts"] != 2.0 ||
		targets[1].(map[string]any)["upstream"] != "b" || targets[1].(map[string]any)["model"] != "llama3.1" {
		t.Fatalf("access line targets %v", targets)
	}
}

func TestOpenBreakerSendsStraightToFallback(t *testing.T) {
	t.Parallel()
	primary := upstreamtest.Start(t, upstreamtest.Step{Status: 500})
	fallback := upstreamtest.Start(t, upstreamtest.Step{Body: "fallback"})
	h := startProxy(t, primary.URL, func(o *Options) {
		o.Upstreams[0].Breaker = breaker.Settings{ConsecutiveFailures: 1, MinRequests: 1000, OpenFor: time.Minute}
		o.Routes[0].Retry.MaxAttempts = 1
		withFallbacks(o, []string{fallback.URL})
	})
	for i := 0; i < 3; i++ {
		if resp, body := h.chat(""); resp.StatusCode != 200 || string(body) != "fallback" {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
	}
	if primary.Count() != 1 {
		t.Fatalf("primary got %d requests with its breaker open", primary.Count())
	}
}

func TestFailoverOn404AndContextLengthCode(t *testing.T) {
	t.Parallel()
	fallback := upstreamtest.Start(t, upstreamtest.Step{Body: "big model"})
	for _, tc := range []struct {
		name   string
		step   upstreamtest.Step
		config func(*Route)
		logged string // the primary's result in the access line's targets
	}{
		{"404 in failover_on", upstreamtest.Step{Status: 404, Body: `{"error":{"message":"model not found"}}`},
			func(r *Route) { r.FailoverOn = []int{404} }, "failover_on"},
		{"400 code in failover_codes", upstreamtest.Step{Status: 400, Header: [][2]string{upstreamtest.JSONHeader},
			Body: `{"error":{"message":"too long","type":"invalid_request_error","code":"context_length_exceeded"}}`},
			func(r *Route) { r.FailoverCodes = []string{"context_length_exceeded"} }, "failover_code"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			primary := upstreamtest.Start(t, tc.step)
			h := startProxy(t, primary.URL, func(o *Options) {
				tc.config(&o.Routes[0])
				withFallbacks(o, []string{fallback.URL})
			})
			if resp, body := h.chat(""); resp.StatusCode != 200 || string(body) != "big model" {
				t.Fatalf("got %d %q", resp.StatusCode, body)
			}
			// The client never saw the 4xx: it was not passed through.
			if got := h.accessLines(1)[0]["targets"].([]any)[0].(map[string]any)["result"]; got != tc.logged {
				t.Fatalf("the primary's result logged as %v, want %s", got, tc.logged)
			}
		})
	}
	// Without failover_on a 4xx passes through untouched, fallback or not.
	primary := upstreamtest.Start(t, upstreamtest.Step{Status: 404, Body: "missing"})
	h := startProxy(t, primary.URL, func(o *Options) { withFallbacks(o, []string{fallback.URL}) })
	if resp, body := h.chat(""); resp.StatusCode != 404 || string(body) != "missing" || resp.Header.Get("X-Sturdy-Upstream") != "" {
		t.Fatalf("plain 404: %d %q %v", resp.StatusCode, body, resp.Header)
	}
}

func TestTimeoutFailsOverWithoutRetryingInPlace(t *testing.T) {
	t.Parallel()
	primary := upstreamtest.Start(t, upstreamtest.Step{Fault: upstreamtest.Hang})
	fallback := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, primary.URL, func(o *Options) {
		o.Upstreams[0].Timeouts.FirstByte = 200 * time.Millisecond
		o.Routes[0].Retry.OnTimeout = "failover"
		withFallbacks(o, []string{fallback.URL})
	})
	if resp, body := h.chat(""); resp.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	if primary.Count() != 1 {
		t.Fatalf("silent primary tried %d times; on_timeout failover must move on", primary.Count())
	}
}

func TestMaxTotalAttemptsSpansAllTargets(t *testing.T) {
	t.Parallel()
	a := upstreamtest.Start(t, upstreamtest.Step{Status: 503})
	b := upstreamtest.Start(t, upstreamtest.Step{Status: 503})
	c := upstreamtest.Start(t, upstreamtest.Step{Status: 503})
	h := startProxy(t, a.URL, func(o *Options) {
		o.Routes[0].Retry.MaxAttempts = 3
		withFallbacks(o, []string{b.URL, c.URL})
		o.Routes[0].Retry.MaxTotalAttempts = 4
	})
	resp, _ := h.chat("")
	total := a.Count() + b.Count() + c.Count()
	if resp.StatusCode != 503 || total != 4 || resp.Header.Get("X-Sturdy-Attempts") != "4" || resp.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("status %d after %d+%d+%d attempts (header %s)", resp.StatusCode, a.Count(), b.Count(), c.Count(), resp.Header.Get("X-Sturdy-Attempts"))
	}
}

func TestLongRetryAfterFailsOver(t *testing.T) {
	t.Parallel()
	primary := upstreamtest.Start(t, upstreamtest.Step{Status: 429, Header: [][2]string{{"Retry-After", "120"}}})
	fallback := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, primary.URL, func(o *Options) { withFallbacks(o, []string{fallback.URL}) })
	start := time.Now()
	if resp, body := h.chat(""); resp.StatusCode != 200 || string(body) != "ok" || time.Since(start) > 2*time.Second {
		t.Fatalf("got %d %q after %v", resp.StatusCode, body, time.Since(start))
	}
}

func TestStreamFailsOverBeforeFirstByteAndOnFirstTokenLimit(t *testing.T) {
	t.Parallel()
	primary := upstreamtest.Start(t,
		upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Fault: upstreamtest.Cut},
		upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: upstreamtest.SSE("slow"), FirstDelay: 2 * time.Second})
	fallback := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader}, Chunks: upstreamtest.SSE("fast")})
	h := startProxy(t, primary.URL, func(o *Options) {
		o.Routes[0].Retry.MaxAttempts = 1
		o.Routes[0].FirstToken = 300 * time.Millisecond
		withFallbacks(o, []string{fallback.URL})
	})
	for i := 0; i < 2; i++ {
		start := time.Now()
		resp, body := h.chat(`{"stream":true}`)
		if resp.StatusCode != 200 || !strings.Contains(string(body), `"fast"`) || time.Since(start) > 1500*time.Millisecond {
			t.Fatalf("request %d: %d %q after %v", i, resp.StatusCode, body, time.Since(start))
		}
	}
}

func TestFirstTokenAppliesOnlyToStreams(t *testing.T) {
	t.Parallel()
	slow := upstreamtest.Start(t, upstreamtest.Step{Delay: 600 * time.Millisecond, Body: "whole reply"})
	h := startProxy(t, slow.URL, func(o *Options) { o.Routes[0].FirstToken = 200 * time.Millisecond })
	if resp, body := h.chat(`{"stream":false}`); resp.StatusCode != 200 || string(body) != "whole reply" {
		t.Fatalf("non-streamed request cut by first_token: %d %q", resp.StatusCode, body)
	}
	for _, tt := range []struct {
		path, body string
		want       bool
	}{
		{"/api/chat", `{"model":"m"}`, true}, {"/v1/chat/completions", `{"model":"m"}`, false},
		{"/api/chat", `{"stream":false}`, false}, {"/v1/chat/completions", `{"messages":[],"stream":true}`, true},
	} {
		if _, stream := bodyFields([]byte(tt.body)); asksToStream(policy.APIOf([]byte(tt.path)), stream) != tt.want {
			t.Errorf("%s %s: asks to stream %v", tt.path, tt.body, !tt.want)
		}
	}
}

func TestModelGlobsPickTheRoute(t *testing.T) {
	t.Parallel()
	gpt := upstreamtest.Start(t, upstreamtest.Step{Body: "gpt"})
	mini := upstreamtest.Start(t, upstreamtest.Step{Body: "mini"})
	other := upstreamtest.Start(t, upstreamtest.Step{Body: "other"})
	h := startProxy(t, other.URL, func(o *Options) {
		o.Upstreams = append(o.Upstreams, testUpstream("gpt", gpt.URL), testUpstream("mini", mini.URL))
		r1, r2 := testRoute("gpt"), testRoute("mini")
		r1.Name, r1.Model = "gpt", "gpt-4o*"
		r2.Name, r2.Model = "mini", "gpt-4o-mini*"
		o.Routes = append(o.Routes, r1, r2)
	})
	for model, want := range map[string]string{"gpt-4o": "gpt", "gpt-4o-2024-08-06": "gpt", "gpt-4o-mini": "mini", "llama3.1": "other", "": "other"} {
		if _, body := h.chat(`{"model":"` + model + `","messages":[]}`); string(body) != want {
			t.Errorf("model %q went to %q, want %q", model, body, want)
		}
	}
}

func TestOne429IsLearnedOnce(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 429, Header: [][2]string{{"Retry-After", "1"}}}, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, nil)
	var wg sync.WaitGroup
	statuses := make([]int, 5)
	for i := range statuses {
		if i == 1 {
			// The first one meets the 429; the others come, 50 ms apart,
			// once Sturdy has it (a head start of 50 ms is not always
			// enough under load).
			for deadline := time.Now().Add(5 * time.Second); h.p.Upstreams()[0].CooldownUntil == nil; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the 429 started no cooldown")
				}
			}
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			time.Sleep(time.Duration(max(0, i-1)) * 50 * time.Millisecond)
			resp, _ := h.chat("")
			statuses[i] = resp.StatusCode
		}(i)
	}
	wg.Wait()
	for i, s := range statuses {
		if s != 200 {
			t.Fatalf("request %d: %d", i, s)
		}
	}
	reqs := up.Requests()
	if len(reqs) != 6 { // one 429, then the five requests after the cooldown
		t.Fatalf("upstream saw %d requests, want 6: the 429 was rediscovered", len(reqs))
	}
	for _, r := range reqs[1:] {
		if r.At.Sub(reqs[0].At) < time.Second-10*time.Millisecond {
			t.Fatalf("a request reached the upstream %v after its 429 asked for 1s", r.At.Sub(reqs[0].At))
		}
	}
}

func TestCooldownBelongsToTheCredential(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 429, Header: [][2]string{{"Retry-After", "5"}}, Body: "quota"},
		upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, func(o *Options) { o.Routes[0].Retry.MaxRetryAfter = time.Second })
	// Client X meets the 429; its wait (5s) is above max_retry_after.
	if resp, body := h.chat("", "Authorization", "Bearer sk-x"); resp.StatusCode != 429 || string(body) != "quota" {
		t.Fatalf("first: %d %q", resp.StatusCode, body)
	}
	// X again: Sturdy answers at once, the upstream is not asked.
	resp, body := h.chat("", "Authorization", "Bearer sk-x")
	code, _ := errorOf(t, body)
	ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	ms, _ := strconv.Atoi(resp.Header.Get("Retry-After-Ms"))
	// The cooldown's end is extended by up to 10 %: never earlier than asked.
	if resp.StatusCode != 429 || code != CodeRateLimited || ra < 4 || ra > 6 || ms < 3500 || ms > 5500 || up.Count() != 1 {
		t.Fatalf("during cooldown: %d %s Retry-After=%d ms=%d upstream=%d", resp.StatusCode, body, ra, ms, up.Count())
	}
	// Client Y, another key on the same upstream, is not blocked.
	if resp, body := h.chat("", "Authorization", "Bearer sk-y"); resp.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("other credential: %d %q", resp.StatusCode, body)
	}
	if strings.Contains(h.logs.String(), "sk-x") || strings.Contains(h.logs.String(), "sk-y") {
		t.Fatal("a credential reached the log")
	}
}

func TestRateLimitHeadersOnA200StartACooldownAndFallbackTakesOver(t *testing.T) {
	t.Parallel()
	primary := upstreamtest.Start(t, upstreamtest.Step{Body: "primary",
		Header: [][2]string{{"X-Ratelimit-Remaining-Requests", "0"}, {"X-Ratelimit-Reset-Requests", "6m0s"}}})
	fallback := upstreamtest.Start(t, upstreamtest.Step{Body: "fallback"})
	h := startProxy(t, primary.URL, func(o *Options) { withFallbacks(o, []string{fallback.URL}) })
	if _, body := h.chat(""); string(body) != "primary" {
		t.Fatalf("first: %q", body)
	}
	if _, body := h.chat(""); string(body) != "fallback" || primary.Count() != 1 {
		t.Fatalf("during the cooldown: %q, primary saw %d", body, primary.Count())
	}
}

func TestPacingWaitsOrRefuses(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, func(o *Options) {
		o.Upstreams[0].RateLimit = upstream.RateLimit{RequestsPerSecond: 2, Burst: 1, MaxWait: 100 * time.Millisecond}
	})
	h.chat("")
	resp, body := h.chat("") // would wait ~500ms > max_wait
	code, _ := errorOf(t, body)
	if resp.StatusCode != 429 || code != CodeRateLimited || resp.Header.Get("Retry-After") != "1" || up.Count() != 1 {
		t.Fatalf("over the pace: %d %s %v", resp.StatusCode, body, resp.Header)
	}
	h2 := startProxy(t, up.URL, func(o *Options) {
		o.Upstreams[0].RateLimit = upstream.RateLimit{RequestsPerSecond: 4, Burst: 1, MaxWait: 2 * time.Second}
	})
	start := time.Now()
	for i := 0; i < 3; i++ {
		if resp, _ := h2.chat(""); resp.StatusCode != 200 {
			t.Fatalf("paced request %d: %d", i, resp.StatusCode)
		}
	}
	if el := time.Since(start); el < 400*time.Millisecond {
		t.Fatalf("3 requests at 4/s burst 1 took %v; pacing did not wait", el)
	}
}

func TestClientLimitsAreKeyedPerClient(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, func(o *Options) {
		o.Clients = []ClientLimit{{KeyHeader: "Authorization", RequestsPerSecond: 0.5, Burst: 2}}
	})
	for i, want := range []int{200, 200, 429} {
		if resp, _ := h.chat("", "Authorization", "Bearer agent-a"); resp.StatusCode != want {
			t.Fatalf("agent a request %d: %d, want %d", i, resp.StatusCode, want)
		}
	}
	resp, body := h.chat("", "Authorization", "Bearer agent-a")
	if code, _ := errorOf(t, body); code != CodeRateLimited || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("over the limit: %s %v", body, resp.Header)
	}
	if resp, _ := h.chat("", "Authorization", "Bearer agent-b"); resp.StatusCode != 200 {
		t.Fatalf("agent b blocked by agent a: %d", resp.StatusCode)
	}
	if up.Count() != 3 {
		t.Fatalf("upstream saw %d", up.Count())
	}
	if strings.Contains(h.logs.String(), "agent-a") {
		t.Fatal("client key reached the log")
	}
}

func TestMaxInFlightQueuesThenRefusesOrFailsOver(t *testing.T) {
	t.Parallel()
	slow := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{upstreamtest.SSEHeader},
		Chunks: upstreamtest.SSE("a", "b", "c", "d"), ChunkDelay: 250 * time.Millisecond})
	fallback := upstreamtest.Start(t, upstreamtest.Step{Body: "fallback"})
	for _, withFallback := range []bool{false, true} {
		t.Run(map[bool]string{false: "queued then refused", true: "queued then failed over"}[withFallback], func(t *testing.T) {
			t.Parallel()
			h := startProxy(t, slow.URL, func(o *Options) {
				o.Upstreams[0].MaxInFlight, o.Upstreams[0].QueueTimeout = 1, 200*time.Millisecond
				if withFallback {
					withFallbacks(o, []string{fallback.URL})
				}
			})
			streamDone := make(chan struct{})
			go func() {
				defer close(streamDone)
				resp, err := http.Post(h.url+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true}`))
				if err == nil {
					_, _ = io_ReadAll(resp)
				}
			}()
			time.Sleep(100 * time.Millisecond) // the stream holds the only slot
			start := time.Now()
			resp, body := h.chat("")
			if withFallback {
				if resp.StatusCode != 200 || string(body) != "fallback" {
					t.Fatalf("with fallback: %d %q", resp.StatusCode, body)
				}
			} else {
				code, _ := errorOf(t, body)
				if resp.StatusCode != 503 || code != CodeUpstreamBusy || time.Since(start) < 180*time.Millisecond || resp.Header.Get("Retry-After") == "" {
					t.Fatalf("busy: %d %s after %v", resp.StatusCode, body, time.Since(start))
				}
			}
			<-streamDone
		})
	}
}

func TestRetryBudgetBoundsAmplification(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 503})
	h := startProxy(t, up.URL, func(o *Options) {
		o.Upstreams[0].RetryBudget = upstream.RetryBudget{Ratio: 0.5, MinPerSecond: 1}
		o.Routes[0].Retry.MaxAttempts = 4
	})
	const clients, each = 50, 4
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				h.chat("")
			}
		}()
	}
	wg.Wait()
	sent := clients * each
	// ≤ 1.5 × requests + min_per_second × 10 s window.
	if got, limit := up.Count(), sent*3/2+10; got > limit {
		t.Fatalf("%d client requests caused %d upstream requests; the budget allows %d", sent, got, limit)
	}
	if !strings.Contains(h.logs.String(), `"stop":"retry_budget"`) {
		t.Fatal("no request was stopped by the budget")
	}
}

func TestClientDeadlineHeaders(t *testing.T) {
	t.Parallel()
	hang := upstreamtest.Start(t, upstreamtest.Step{Fault: upstreamtest.Hang})
	h := startProxy(t, hang.URL, nil)
	start := time.Now()
	resp, body := h.chat("", "X-Stainless-Timeout", "0.5")
	code, _ := errorOf(t, body)
	if el := time.Since(start); resp.StatusCode != 504 || code != CodeDeadlineExceeded || el > 1500*time.Millisecond ||
		!strings.Contains(string(body), `up: 1 attempt, last timeout`) {
		t.Fatalf("client timeout: %d %s after %v", resp.StatusCode, body, el)
	}
	// With a reply in hand, the wait that does not fit is not started.
	busy := upstreamtest.Start(t, upstreamtest.Step{Status: 503, Header: [][2]string{{"Retry-After", "2"}}, Body: "busy"})
	h2 := startProxy(t, busy.URL, nil)
	start = time.Now()
	resp, body = h2.chat("", "Request-Timeout", "1")
	if resp.StatusCode != 503 || string(body) != "busy" || resp.Header.Get("X-Should-Retry") != "false" || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("reply within a short client deadline: %d %q after %v", resp.StatusCode, body, time.Since(start))
	}
}

func TestClientRetryGetsOneAttemptPerTarget(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 503})
	h := startProxy(t, up.URL, func(o *Options) { o.Routes[0].Retry.AttemptsOnClientRetry = 1 })
	resp, _ := h.chat("", "X-Stainless-Retry-Count", "1")
	if resp.StatusCode != 503 || up.Count() != 1 {
		t.Fatalf("client retry: %d after %d attempts", resp.StatusCode, up.Count())
	}
	h.chat("", "X-Stainless-Retry-Count", "0")
	if up.Count() != 1+4 {
		t.Fatalf("first try got %d attempts, want max_attempts", up.Count()-1)
	}
}

func TestStatusShowsTrafficPolicyState(t *testing.T) {
	t.Parallel()
	primary := upstreamtest.Start(t, upstreamtest.Step{Status: 429, Header: [][2]string{{"Retry-After", "30"}}})
	fallback := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, primary.URL, func(o *Options) {
		o.Upstreams[0].RateLimit = upstream.RateLimit{RequestsPerSecond: 5, Burst: 3, MaxWait: time.Second}
		o.Upstreams[0].MaxInFlight = 7
		o.Upstreams[0].Breaker = breaker.Settings{ConsecutiveFailures: 1, MinRequests: 1000, OpenFor: time.Minute}
		withFallbacks(o, []string{fallback.URL})
	})
	h.chat("")
	st := h.p.Upstreams()
	a := st[0]
	if a.Cooldowns != 1 || a.CooldownUntil == nil || time.Until(*a.CooldownUntil) < 25*time.Second ||
		a.MaxInFlight != 7 || a.SlotsInUse != 0 || a.Limiter == nil || a.Limiter.Burst != 3 || a.Limiter.Tokens >= 2.9 {
		t.Fatalf("status %+v limiter %+v", a, a.Limiter)
	}
	if st[1].Limiter != nil || st[1].Cooldowns != 0 {
		t.Fatalf("fallback status %+v", st[1])
	}
	if ok, _ := h.p.Ready(); !ok {
		t.Fatal("not ready although the fallback is closed")
	}
}

func TestLastReplyNamesTheUpstreamThatSentIt(t *testing.T) {
	t.Parallel()
	primary := upstreamtest.Start(t, upstreamtest.Step{Status: 503, Body: "primary busy"})
	fallback := upstreamtest.Start(t, upstreamtest.Step{Status: 500})
	h := startProxy(t, primary.URL, func(o *Options) {
		o.Routes[0].Retry.MaxAttempts = 1
		withFallbacks(o, []string{fallback.URL})
		o.Upstreams[1].Breaker = breaker.Settings{ConsecutiveFailures: 1, MinRequests: 1000, OpenFor: time.Minute}
	})
	h.chat("") // opens the fallback's breaker
	resp, body := h.chat("")
	if resp.StatusCode != 503 || string(body) != "primary busy" || resp.Header.Get("X-Sturdy-Upstream") != "up" ||
		resp.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("%d %q %v", resp.StatusCode, body, resp.Header)
	}
	if l := h.accessLines(2)[1]; l["upstream"] != "up" || l["stop"] != "no_target_available" {
		t.Fatalf("access line %v", l)
	}
}

// TestAKeptReplyIsWholeWhenTheNextTargetCannotBeTried: the last reply is
// what the client gets when later targets are skipped, so its body must
// not be given up before an attempt is really made.
func TestAKeptReplyIsWholeWhenTheNextTargetCannotBeTried(t *testing.T) {
	t.Parallel()
	big := `{"error":{"message":"` + strings.Repeat("x", 65_500) + `"}}`
	a := upstreamtest.Start(t, upstreamtest.Step{Status: 500, Header: [][2]string{upstreamtest.JSONHeader}, Body: big})
	b := upstreamtest.Start(t, upstreamtest.Step{Status: 503})
	h := startProxy(t, a.URL, func(o *Options) {
		o.Routes[0].Retry.MaxAttempts = 1
		withFallbacks(o, []string{b.URL})
		o.Upstreams[1].Breaker = breaker.Settings{ConsecutiveFailures: 1, MinRequests: 1000}
		open := testRoute("b")
		open.Name, open.PathPrefix = "open-b", "/b/"
		open.Retry.MaxAttempts = 1
		o.Routes = append(o.Routes, open)
	})
	h.do("POST", "/b/x", `{"model":"m"}`) // opens b's breaker for model m
	resp, body := h.chat(`{"model":"m"}`)
	if resp.StatusCode != 500 || string(body) != big {
		t.Fatalf("%d, %d of %d bytes", resp.StatusCode, len(body), len(big))
	}
}

// TestBodyFields: the top-level "model" and "stream", wherever they stand,
// never a nested one; the first of a repeated key, as gjson.Get reads it.
func TestBodyFields(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ body, model, stream string }{
		{`{"model":"m","stream":true}`, "m", "true"},
		{`{"messages":[{"model":"x","stream":true}],"model":"m"}`, "m", ""},
		{`{"model":"a","model":"b","stream":false,"stream":true}`, "a", "false"},
		{`not json`, "", ""},
		{``, "", ""},
	} {
		model, stream := bodyFields([]byte(tt.body))
		if model.Str != tt.model || stream.Raw != tt.stream {
			t.Errorf("%s: model %q stream %q, want %q %q", tt.body, model.Str, stream.Raw, tt.model, tt.stream)
		}
	}
}

// TestAClientsTimeoutIsMetBeforeIt: with a client's timeout known, an
// upstream slower than it gets 504 deadline_exceeded, not to be retried,
// a margin (policy.Margin) before the client gives up, and its request
// is dropped. Before, Sturdy and the client gave up at the same instant
// (499), and the SDK retried the timeout: three abandoned upstream
// requests for one call.
func TestAClientsTimeoutIsMetBeforeIt(t *testing.T) {
	t.Parallel()
	// 5 s: the margin is half a second, room for a loaded machine's pauses (a 2 s timeout left 200 ms, and one
	// run answered at 1.96 s). The cases run side by side.
	const timeout = 5 * time.Second
	var held atomic.Int32
	slow, _ := heldUpstream(t, &held)
	h := startProxy(t, slow, nil)
	for _, tt := range []struct{ header []string }{
		{[]string{"X-Stainless-Timeout", "5", "X-Stainless-Lang", "js"}},
		{[]string{"X-Stainless-Timeout", "5", "X-Stainless-Lang", "go"}},
		{[]string{"X-Stainless-Read-Timeout", "5"}},
	} {
		t.Run(tt.header[0]+" "+strings.Join(tt.header[2:], " "), func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			resp, body := h.chat("", tt.header...)
			took := time.Since(start)
			if resp.StatusCode != 504 || resp.Header.Get("X-Should-Retry") != "false" || !strings.Contains(string(body), CodeDeadlineExceeded) {
				t.Fatalf("%v: %d %v %s", tt.header, resp.StatusCode, resp.Header, body)
			}
			if want := timeout - policy.Margin(timeout); took >= timeout-50*time.Millisecond || took < want-50*time.Millisecond {
				t.Fatalf("%v: answered after %v, want at %v, before the client's %v", tt.header, took, want, timeout)
			}
		})
	}
}
