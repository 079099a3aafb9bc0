package proxy

import (
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"sturdy/breaker"
	"sturdy/internal/upstreamtest"
	"sturdy/policy"
)

// TestZeroOptionsMeanTheDefaults: an upstream and a route with nothing
// but their names get every default — a zero timeout, deadline or body
// limit never means "at once" or "nothing".
func TestZeroOptionsMeanTheDefaults(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t, upstreamtest.Step{Delay: 100 * time.Millisecond, Body: "ok"})
	p, err := New(Options{Upstreams: []Upstream{{Name: "up", URL: up.URL}}, Routes: []Route{{Name: "r", Upstream: "up"}},
		Clients: []ClientLimit{{RequestsPerSecond: 2.5}}, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	tbl := p.tbl.Load()
	u, r, cl := tbl.upstreams[0], tbl.routes[0], tbl.clients[0]
	ep := u.endpointsNow()[0]
	if ep.spec.connect != DefaultConnectTimeout || u.firstByte != DefaultFirstByteTimeout || u.idle != DefaultIdleTimeout ||
		ep.client.MaxConns != DefaultMaxConnections || u.budget.Ratio != DefaultBudgetRatio || u.budget.MinPerSecond != DefaultBudgetPerSecond ||
		u.limiter != nil || u.slots != nil {
		t.Errorf("upstream defaults: %+v", u.opts)
	}
	if r.deadline != DefaultDeadline || r.maxBody != DefaultMaxBody || r.clientRetries != DefaultClientRetries ||
		r.retry != (policy.Retry{}).WithDefaults(0) || r.firstToken != 0 || tbl.maxBody != DefaultMaxBody ||
		r.maxRescueBytes != DefaultMaxRescueBytes || u.cooldowns.max != DefaultCooldownMax {
		t.Errorf("route defaults: %+v", r)
	}
	if cl.opts.KeyHeader != DefaultKeyHeader || cl.opts.Burst != 3 || string(cl.header) != "Authorization" {
		t.Errorf("client limit defaults: %+v", cl.opts)
	}
	if p.limits != (ServerLimits{ReadTimeout: DefaultReadTimeout, IdleTimeout: DefaultServerIdle, MaxHeaderBytes: DefaultMaxHeaderBytes,
		MaxConnections: defaultMaxConnections(openFileLimit()), WriteTimeout: DefaultWriteTimeout,
		MaxBufferedBytes: DefaultMaxBufferedBytes}) || p.held.max.Load() != DefaultMaxBufferedBytes {
		t.Errorf("server limits: %+v", p.limits)
	}
	h := &harness{t: t, p: p, url: serve(t, p), logs: &upstreamtest.LogBuffer{}}
	if resp, body := h.chat(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 100_000) + `"}]}`); resp.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("a request through zero-valued options: %d %q", resp.StatusCode, body)
	}
}

func TestUpstreamWithDefaults(t *testing.T) {
	t.Parallel()
	paced := Upstream{RateLimit: RateLimit{RequestsPerSecond: 2.5}, RetryBudget: RetryBudget{Ratio: 0.2}}.withDefaults()
	if paced.RateLimit.Burst != 3 || paced.RateLimit.MaxWait != DefaultPacingMaxWait ||
		paced.RetryBudget != (RetryBudget{Ratio: 0.2, MinPerSecond: DefaultBudgetPerSecond}) {
		t.Errorf("paced: %+v", paced)
	}
	set := Upstream{ConnectTimeout: time.Second, FirstByteTimeout: 3 * time.Second, IdleTimeout: 4 * time.Second, MaxConnections: 7,
		QueueTimeout: time.Millisecond, RateLimit: RateLimit{RequestsPerSecond: 1, Burst: 9, MaxWait: time.Millisecond},
		RetryBudget: RetryBudget{Ratio: 1, MinPerSecond: 1}, Breaker: breaker.Settings{ConsecutiveFailures: 2}}
	if got := set.withDefaults(); got.ConnectTimeout != set.ConnectTimeout || got.FirstByteTimeout != set.FirstByteTimeout ||
		got.IdleTimeout != set.IdleTimeout || got.MaxConnections != 7 || got.QueueTimeout != set.QueueTimeout ||
		got.RateLimit != set.RateLimit || got.RetryBudget != set.RetryBudget {
		t.Errorf("explicit values changed: %+v", got)
	}
}
