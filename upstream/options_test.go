package upstream

import (
	"testing"
	"time"

	"sturdy/breaker"
	"sturdy/internal/upstreamtest"
)

func TestUpstreamWithDefaults(t *testing.T) {
	t.Parallel()
	paced := Options{RateLimit: RateLimit{RequestsPerSecond: 2.5}, RetryBudget: RetryBudget{Ratio: 0.2}}.WithDefaults()
	if paced.RateLimit.Burst != 3 || paced.RateLimit.MaxWait != DefaultPacingMaxWait ||
		paced.RetryBudget != (RetryBudget{Ratio: 0.2, MinPerSecond: DefaultBudgetPerSecond}) {
		t.Errorf("paced: %+v", paced)
	}
	set := Options{Timeouts: Timeouts{Connect: time.Second, FirstByte: 3 * time.Second, Idle: 4 * time.Second}, MaxConnections: 7,
		QueueTimeout: time.Millisecond, RateLimit: RateLimit{RequestsPerSecond: 1, Burst: 9, MaxWait: time.Millisecond},
		RetryBudget: RetryBudget{Ratio: 1, MinPerSecond: 1}, Breaker: breaker.Settings{ConsecutiveFailures: 2}}
	if got := set.WithDefaults(); got.Timeouts != set.Timeouts ||
		got.MaxConnections != 7 || got.QueueTimeout != set.QueueTimeout ||
		got.RateLimit != set.RateLimit || got.RetryBudget != set.RetryBudget {
		t.Errorf("explicit values changed: %+v", got)
	}
}

// TestAnUpstreamOfDefaultsUsesThem: an upstream with nothing but its
// name and url gets every default — a zero timeout never means "at once"
// — and no pacing, no max_in_flight.
func TestAnUpstreamOfDefaultsUsesThem(t *testing.T) {
	t.Parallel()
	srv := upstreamtest.Start(t, upstreamtest.Step{Body: "ok"})
	u, err := New(testEnv(), Options{Name: "up", URL: srv.URL}.WithDefaults(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ep := u.Endpoints()[0]
	if ep.spec.connect != DefaultConnectTimeout || ep.spec.firstByte != DefaultFirstByteTimeout || ep.spec.idle != DefaultIdleTimeout ||
		ep.client.MaxConns != DefaultMaxConnections || u.budget.Ratio != DefaultBudgetRatio || u.budget.MinPerSecond != DefaultBudgetPerSecond ||
		u.limiter != nil || u.slots != nil || u.cooldowns.max != DefaultCooldownMax || u.bareCooldown != DefaultBareCooldown {
		t.Errorf("upstream defaults: %+v", u.opts)
	}
}
