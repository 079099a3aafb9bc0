package upstream

import (
	"fmt"
	"testing"
	"time"

	"sturdy/breaker"
	"sturdy/internal/upstreamtest"
)

// TestDebugUpstreamsListsAtMost256ModelBreakers: the reply breakers an
// upstream shows are bounded in all, whatever its endpoints hold, the
// worst first, with a count of the rest. Before, each endpoint listed
// 256: a 64-endpoint pool answered 6.9 MB a call.
func TestDebugUpstreamsListsAtMost256ModelBreakers(t *testing.T) {
	t.Parallel()
	a, b := upstreamtest.Start(t, upstreamtest.Step{Body: "{}"}), upstreamtest.Start(t, upstreamtest.Step{Body: "{}"})
	o := Options{Name: "up", Endpoints: []string{a.URL, b.URL}, MaxConnections: 8}
	up, err := New(testEnv(), o.WithDefaults(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(up.Close)
	for e, ep := range up.Endpoints() {
		ep.models = breaker.NewGroup("up", breaker.GroupSettings{Max: 1000,
			Breaker: breaker.Settings{ConsecutiveFailures: 1, OpenFor: time.Minute}})
		for i := 0; i < 300; i++ {
			ep.models.Get(fmt.Sprint("model-", e, "-", i), time.Now())
		}
	}
	tk, _ := up.Endpoints()[1].models.Get("model-1-3", time.Now()).Allow()
	tk.DoneWith(breaker.Failure, "500")
	s := up.Status(time.Now())
	if n := len(s.ModelBreakers); n != MaxListedModelBreakers || s.ModelBreakersNotListed != 600-MaxListedModelBreakers {
		t.Fatalf("%d model breakers listed and %d not, want %d and %d", n, s.ModelBreakersNotListed, MaxListedModelBreakers, 600-MaxListedModelBreakers)
	}
	if first := s.ModelBreakers[0]; first.Model != "model-1-3" || first.State != "open" {
		t.Fatalf("the first listed is %+v, want the open one", first)
	}
}

// TestTokensPerMinutePicksTheMostLiteralGlobAndIsListed: a model takes
// the most literal glob that matches it; /debug/upstreams lists each
// window; a reload keeps a glob's window.
func TestTokensPerMinutePicksTheMostLiteralGlobAndIsListed(t *testing.T) {
	t.Parallel()
	o := Options{Name: "up", URL: "http://127.0.0.1:1", TokensPerMinute: map[string]int64{"*": 10, "gpt-4o*": 100, "gpt-4o-mini": 1000}}
	up, err := New(testEnv(), o.WithDefaults(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(up.Close)
	for model, want := range map[string]string{"gpt-4o-mini": "gpt-4o-mini", "gpt-4o-2024": "gpt-4o*", "llama": "*"} {
		if got := up.Tokens(model); got == nil || got.Glob != want {
			t.Errorf("%s: window %+v, want %s", model, got, want)
		}
	}
	now := time.Now()
	up.Tokens("gpt-4o").Window.Reserve(30, now)
	st := up.Status(now).TokensPerMinute
	if len(st) != 3 || st[1].Model != "gpt-4o*" || st[1].Limit != 100 || st[1].Reserved != 30 || st[1].Remaining != 70 {
		t.Fatalf("listed %+v", st)
	}
	o.TokensPerMinute["gpt-4o*"] = 200
	next, err := New(testEnv(), o.WithDefaults(), up)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(next.Close)
	if s := next.Tokens("gpt-4o").Window.State(now); s.Limit != 200 || s.Reserved != 30 {
		t.Fatalf("after a reload %+v", s)
	}
}
