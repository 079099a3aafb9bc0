package proxy

import (
	"time"

	"sturdy/breaker"
)

// UpstreamStatus is what the admin listener's /debug/upstreams shows of
// one upstream. It carries no secret: the URL has no credentials (config
// refuses user info) and the API key is never included.
type UpstreamStatus struct {
	Name string `json:"name"`
	URL  string `json:"url"`
	// Breaker is the connection breaker's state (connect refused, resets,
	// TLS); ModelBreakers the reply breakers per model (5xx, timeouts).
	Breaker       string              `json:"breaker"`
	ModelBreakers []ModelBreakerState `json:"model_breakers"`
	// ProbeInMS is the time until an open breaker lets a probe through.
	ProbeInMS int64 `json:"probe_in_ms"`
	// Counts are the breaker's counts in its current window.
	Counts struct {
		Requests            uint32 `json:"requests"`
		Successes           uint32 `json:"successes"`
		Failures            uint32 `json:"failures"`
		Exclusions          uint32 `json:"exclusions"`
		ConsecutiveFailures uint32 `json:"consecutive_failures"`
	} `json:"counts"`
	// InFlight counts requests using the upstream, streams included.
	InFlight int64 `json:"in_flight"`
	// OpenConnections counts connections open to the upstream.
	OpenConnections int `json:"open_connections"`
	// MaxInFlight is the configured cap (0: unlimited); SlotsInUse the
	// slots taken under it.
	MaxInFlight int `json:"max_in_flight"`
	SlotsInUse  int `json:"slots_in_use"`
	// Cooldowns counts credentials cooling down after a 429;
	// CooldownUntil is the latest end among them.
	Cooldowns     int        `json:"cooldowns"`
	CooldownUntil *time.Time `json:"cooldown_until"`
	// Limiter is the pacing state, absent without rate_limit.
	Limiter *LimiterStatus `json:"limiter,omitempty"`
}

// ModelBreakerState is one model's reply breaker on an upstream.
type ModelBreakerState struct {
	Model     string `json:"model"`
	State     string `json:"state"`
	ProbeInMS int64  `json:"probe_in_ms"`
	Failures  uint32 `json:"failures"`
}

// LimiterStatus is an upstream's pacing limiter.
type LimiterStatus struct {
	RequestsPerSecond float64 `json:"requests_per_second"`
	Burst             int     `json:"burst"`
	// Tokens available now (negative: requests are waiting).
	Tokens float64 `json:"tokens"`
}

// Upstreams reports the state of every configured upstream.
func (p *Proxy) Upstreams() []UpstreamStatus {
	now := time.Now()
	var out []UpstreamStatus
	for _, up := range p.tbl.Load().upstreams {
		s := UpstreamStatus{Name: up.name, URL: up.opts.URL, Breaker: up.breaker.State().String(),
			ProbeInMS: up.breaker.ProbeIn(now).Milliseconds(), InFlight: up.inFlight.Load(),
			OpenConnections: up.client.ConnsCount()}
		s.MaxInFlight, s.SlotsInUse = cap(up.slots), len(up.slots)
		if n, until := up.cooldowns.active(now); n > 0 {
			s.Cooldowns, s.CooldownUntil = n, &until
		}
		if up.limiter != nil {
			s.Limiter = &LimiterStatus{RequestsPerSecond: float64(up.limiter.Limit()), Burst: up.limiter.Burst(),
				Tokens: up.limiter.TokensAt(now)}
		}
		s.ModelBreakers = []ModelBreakerState{}
		for _, m := range up.models.Members() {
			s.ModelBreakers = append(s.ModelBreakers, ModelBreakerState{Model: m.Key, State: m.State().String(),
				ProbeInMS: m.ProbeIn(now).Milliseconds(), Failures: m.Counts().TotalFailures})
		}
		c := up.breaker.Counts()
		s.Counts.Requests, s.Counts.Successes, s.Counts.Failures = c.Requests, c.TotalSuccesses, c.TotalFailures
		s.Counts.Exclusions, s.Counts.ConsecutiveFailures = c.TotalExclusions, c.ConsecutiveFailures
		out = append(out, s)
	}
	return out
}

// modelBreakerState is the state of model's reply breaker on up (closed
// when it has none).
func modelBreakerState(up *upstream, model string) string {
	if m := up.models.Peek(model); m != nil {
		return m.State().String()
	}
	return breaker.StateClosed.String()
}

// Ready reports whether every route has a target that is not open
// (half-open counts as ready: probes go through); notReady names the
// routes that have none. While draining it is false (see Draining).
func (p *Proxy) Ready() (ok bool, notReady []string) {
	if p.Draining() {
		return false, nil
	}
	for _, r := range p.tbl.Load().routes {
		ready := false
		for _, t := range r.targets {
			if t.up.breaker.State() != breaker.StateOpen {
				ready = true
				break
			}
		}
		if !ready {
			notReady = append(notReady, r.name)
		}
	}
	return len(notReady) == 0, notReady
}

// RefreshBreakerGauges brings the breaker-state gauges up to date: an open
// breaker turns half-open lazily, when someone looks.
func (p *Proxy) RefreshBreakerGauges() {
	for _, up := range p.tbl.Load().upstreams {
		p.m.BreakerState.WithLabelValues(up.name).Set(float64(up.breaker.State()))
	}
}
