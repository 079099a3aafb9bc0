package upstream

import (
	"fmt"
	"testing"
	"time"

	"sturdy/breaker"
	"sturdy/internal/upstreamtest"
)

// TestDebugUpstreamsListsAtMost256ModelBreakers: an endpoint's reply
// breakers shown are bounded whatever the group holds.
func TestDebugUpstreamsListsAtMost256ModelBreakers(t *testing.T) {
	t.Parallel()
	srv := upstreamtest.Start(t, upstreamtest.Step{Body: "{}"})
	up := startUpstream(t, srv.URL)
	ep := up.Endpoints()[0]
	ep.models = breaker.NewGroup("up", breaker.GroupSettings{Max: 1000})
	for i := 0; i < 600; i++ {
		ep.models.Get(fmt.Sprint("model-", i), time.Now())
	}
	if n := len(up.Status(time.Now()).ModelBreakers); n != MaxListedModelBreakers {
		t.Fatalf("%d model breakers listed, want %d", n, MaxListedModelBreakers)
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
