package proxy

import (
	"strings"
	"testing"
	"time"

	"sturdy/breaker"
	"sturdy/internal/upstreamtest"
)

func chatModel(model string) string {
	return `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`
}

// TestA429ForOneModelDoesNotBlockAnother: providers rate-limit per key and
// per model, so cooldowns are keyed by (upstream, credential, model).
func TestA429ForOneModelDoesNotBlockAnother(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 429, Header: [][2]string{{"Retry-After", "30"}}, Body: "a is spent"},
		upstreamtest.Step{Body: "b answered"})
	h := startProxy(t, up.URL, func(o *Options) { o.Routes[0].Retry.MaxRetryAfter = time.Second })
	if resp, _ := h.chat(chatModel("a")); resp.StatusCode != 429 {
		t.Fatalf("model a: %d", resp.StatusCode)
	}
	if resp, body := h.chat(chatModel("b")); resp.StatusCode != 200 || string(body) != "b answered" {
		t.Fatalf("model b blocked by model a's 429: %d %q", resp.StatusCode, body)
	}
	if resp, _ := h.chat(chatModel("a")); resp.StatusCode != 429 || up.Count() != 2 {
		t.Fatalf("model a again should be answered from its cooldown: %d, upstream saw %d", resp.StatusCode, up.Count())
	}
}

// TestTokenQuotaHeadersStartACooldown: x-ratelimit-remaining-tokens: 0 is
// learned like the requests quota.
func TestTokenQuotaHeadersStartACooldown(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Header: [][2]string{{"X-Ratelimit-Remaining-Tokens", "0"},
		{"X-Ratelimit-Reset-Tokens", "20s"}}, Body: "last one"}, upstreamtest.Step{Body: "too soon"})
	h := startProxy(t, up.URL, nil)
	h.chat(chatModel("m"))
	if resp, _ := h.chat(chatModel("m")); resp.StatusCode != 429 || up.Count() != 1 {
		t.Fatalf("the token quota was not learned: %d, upstream saw %d", resp.StatusCode, up.Count())
	}
}

// TestA429WithoutAWaitStartsADoublingCooldown: a server that says "too
// many" without saying for how long gets a short cooldown that doubles on
// repeats and ends with a success.
func TestA429WithoutAWaitStartsADoublingCooldown(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 429, Body: "slow down"})
	h := startProxy(t, up.URL, func(o *Options) {
		o.Upstreams[0].Cooldown.WithoutHeader = 200 * time.Millisecond
		o.Routes[0].Retry.MaxAttempts = 1
		o.Routes[0].Retry.MaxRetryAfter = 50 * time.Millisecond // answered at once, not waited out
	})
	h.chat(chatModel("m"))
	if resp, _ := h.chat(chatModel("m")); resp.StatusCode != 429 || up.Count() != 1 {
		t.Fatalf("no cooldown after a bare 429: upstream saw %d", up.Count())
	}
	time.Sleep(250 * time.Millisecond) // past the first cooldown (200 ms + up to 10 %)
	h.chat(chatModel("m"))             // a second bare 429: 400 ms now
	time.Sleep(250 * time.Millisecond)
	if h.chat(chatModel("m")); up.Count() != 2 {
		t.Fatalf("the second cooldown did not double: upstream saw %d", up.Count())
	}
	time.Sleep(300 * time.Millisecond)
	up.SetScript(upstreamtest.Step{Body: "ok"})
	if resp, _ := h.chat(chatModel("m")); resp.StatusCode != 200 {
		t.Fatalf("after the cooldown: %d", resp.StatusCode)
	}
	if n := h.p.tbl.Load().upstreams[0].Cooldowns().InStreak(); n {
		t.Fatalf("a success did not end the run of bare 429s (in a streak: %v)", n)
	}
}

func TestCooldownsOffLearnNothing(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 429, Header: [][2]string{{"Retry-After", "30"}}}, upstreamtest.Step{Body: "ok"})
	h := startProxy(t, up.URL, func(o *Options) {
		off := false
		o.Upstreams[0].Cooldown.Enabled = &off
		o.Routes[0].Retry.MaxRetryAfter = time.Second
	})
	h.chat(chatModel("m"))
	if resp, body := h.chat(chatModel("m")); resp.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("with cooldowns off a 429 was learned: %d %q", resp.StatusCode, body)
	}
}

// TestAFailingModelOpensOnlyItsOwnBreaker: 5xx open the reply breaker of
// (upstream, model); another model on the same upstream — a fallback
// included — goes on, and /readyz follows the connection breakers only.
func TestAFailingModelOpensOnlyItsOwnBreaker(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Status: 503, Body: "big is down"})
	h := startProxy(t, up.URL, func(o *Options) {
		o.Upstreams[0].Breaker = breaker.Settings{ConsecutiveFailures: 2, MinRequests: 1000, OpenFor: time.Minute}
		o.Routes[0].Retry.MaxAttempts = 2
		o.Routes[0].Fallbacks = []Target{{Upstream: "up", Model: "small"}}
		o.Routes[0].Retry.MaxTotalAttempts = 3
	})
	h.chat(chatModel("big")) // 2 failures on big (the breaker opens), then small: 503 too, 1 failure
	up.SetScript(upstreamtest.Step{Body: "small answered"})
	resp, body := h.chat(chatModel("big"))
	if resp.StatusCode != 200 || string(body) != "small answered" || !strings.Contains(string(up.Requests()[len(up.Requests())-1].Body), `"small"`) {
		t.Fatalf("the fallback to another model on the same upstream: %d %q", resp.StatusCode, body)
	}
	line := h.accessLines(2)[1]
	if tg := line["targets"].([]any)[0].(map[string]any); tg["result"] != "breaker_open" || tg["breaker"] != "model" {
		t.Fatalf("big's breaker did not refuse it: %v", line)
	}
	if ok, _ := h.p.Ready(); !ok {
		t.Fatal("a model's breaker made the proxy unready")
	}
	var open bool
	for _, m := range h.p.Upstreams()[0].ModelBreakers {
		open = open || m.Model == "big" && m.State == "open"
	}
	if !open {
		t.Fatalf("/debug/upstreams does not show big's open breaker: %+v", h.p.Upstreams()[0].ModelBreakers)
	}
}

// TestInsufficientQuotaFailsOver: billing spent on one provider passes
// through, unless the route has somewhere else to go.
func TestInsufficientQuotaFailsOver(t *testing.T) {
	t.Parallel()
	spent := `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`
	primary := upstreamtest.Start(t, upstreamtest.Step{Status: 429, Header: [][2]string{upstreamtest.JSONHeader}, Body: spent})
	other := upstreamtest.Start(t, upstreamtest.Step{Body: "paid for"})
	h := startProxy(t, primary.URL, func(o *Options) { withFallbacks(o, []string{other.URL}) })
	if resp, body := h.chat(""); resp.StatusCode != 200 || string(body) != "paid for" {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
}

func TestModelLabelsComeFromTheConfig(t *testing.T) {
	t.Parallel()
	tbl := &table{models: []string{"llama3.1", "gpt-4o*"}}
	for model, want := range map[string]string{"llama3.1": "llama3.1", "gpt-4o-mini": "gpt-4o*", "anything else": "other", "": "other"} {
		if got := tbl.modelLabel(model); got != want {
			t.Errorf("%q: %q, want %q", model, got, want)
		}
	}
}
