package upstream

import (
	"cmp"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sturdy/breaker"
)

// Status is what the admin listener's /debug/upstreams shows of
// one upstream. It carries no secret: the URL has no credentials (config
// refuses user info) and the API key is never included.
type Status struct {
	Name string `json:"name"`
	// URL is the configured url ("" for a pool of endpoints or DNS).
	URL string `json:"url"`
	// Breaker is the pool's state as one breaker: open when every
	// endpoint is out, else the best of the endpoints' connection
	// breakers (connect refused, resets, TLS). ModelBreakers are the
	// reply breakers per model (5xx, timeouts) of every endpoint, at most
	// MaxListedModelBreakers in all, the worst first; ModelBreakersNotListed
	// counts the rest.
	Breaker                string              `json:"breaker"`
	ModelBreakers          []ModelBreakerState `json:"model_breakers"`
	ModelBreakersNotListed int                 `json:"model_breakers_not_listed"`
	// ProbeInMS is the time until an endpoint lets a probe through, when
	// every one is out.
	ProbeInMS int64 `json:"probe_in_ms"`
	// Endpoints are the pool's replicas.
	Endpoints []EndpointStatus `json:"endpoints"`
	// Counts are the connection breakers' counts in their current
	// windows, summed over the endpoints.
	Counts struct {
		Requests            uint32 `json:"requests"`
		Successes           uint32 `json:"successes"`
		Failures            uint32 `json:"failures"`
		Exclusions          uint32 `json:"exclusions"`
		ConsecutiveFailures uint32 `json:"consecutive_failures"`
	} `json:"counts"`
	// InFlight counts requests using the upstream, streams included.
	InFlight int64 `json:"in_flight"`
	// OpenConnections counts connections open to the endpoints.
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
	// TokensPerMinute is each model glob's window (tokens_per_minute).
	TokensPerMinute []TokenWindowStatus `json:"tokens_per_minute,omitempty"`
}

// TokenWindowStatus is one model glob's tokens_per_minute window: its
// limit, what remains of it (negative: a debt), what requests in flight
// hold, and when what it holds has left it.
type TokenWindowStatus struct {
	Model     string `json:"model"`
	Limit     int64  `json:"limit"`
	Remaining int64  `json:"remaining"`
	Reserved  int64  `json:"reserved"`
	ResetMS   int64  `json:"reset_ms"`
}

// EndpointStatus is one endpoint of an upstream's pool.
type EndpointStatus struct {
	// Address is host:port (the resolved address for DNS discovery).
	Address string `json:"address"`
	// State is in, or out with why: ejected (breaker open), probing
	// (half-open), unhealthy (health check), draining (dropped by DNS).
	State   string `json:"state"`
	Breaker string `json:"breaker"`
	// ProbeInMS is the time until its open breaker lets a probe through.
	ProbeInMS int64 `json:"probe_in_ms"`
	// InFlight counts its requests, streams included; Weight is its share
	// while it ramps up after coming back (slow start), 1 otherwise.
	InFlight        int     `json:"in_flight"`
	Weight          float64 `json:"weight"`
	OpenConnections int     `json:"open_connections"`
	// Ejections counts its breaker opening.
	Ejections int64 `json:"ejections"`
	// Health is the last health check's result ("" without checks).
	Health string `json:"health,omitempty"`
	// TrippedOn is what opened its breaker last (the breaker's counts
	// start over at every state change), while it is not closed; Cause
	// says it in words, with the last failure ("5 consecutive failures,
	// the last: connection refused").
	TrippedOn *TripCounts `json:"tripped_on,omitempty"`
	Cause     string      `json:"cause,omitempty"`
	// Concurrency is its limit, its places in flight, its queue per class
	// and the adaptive signal (nil: concurrency off).
	Concurrency *ConcurrencyStatus `json:"concurrency,omitempty"`
}

// TripCounts are the breaker counts that opened a breaker.
type TripCounts struct {
	Requests            uint32 `json:"requests"`
	Failures            uint32 `json:"failures"`
	ConsecutiveFailures uint32 `json:"consecutive_failures"`
}

// ModelBreakerState is one model's reply breaker on an endpoint.
type ModelBreakerState struct {
	Endpoint  string `json:"endpoint"`
	Model     string `json:"model"`
	State     string `json:"state"`
	ProbeInMS int64  `json:"probe_in_ms"`
	// Failures counts the failures in the breaker's current window (its
	// counts start over at every state change: 0 just after it opened);
	// TrippedOn and Cause say what opened it, while it is not closed.
	Failures  uint32      `json:"failures"`
	TrippedOn *TripCounts `json:"tripped_on,omitempty"`
	Cause     string      `json:"cause,omitempty"`
	// Concurrency is its limit, its places in flight, its queue per class
	// and the adaptive signal (nil: concurrency off).
	Concurrency *ConcurrencyStatus `json:"concurrency,omitempty"`
}

// LimiterStatus is an upstream's pacing limiter.
type LimiterStatus struct {
	RequestsPerSecond float64 `json:"requests_per_second"`
	Burst             int     `json:"burst"`
	// Tokens available now (negative: requests are waiting).
	Tokens float64 `json:"tokens"`
}

// MaxListedModelBreakers bounds the model breakers /debug/upstreams lists
// per upstream, all its endpoints together: the worst first (open, then
// half-open, then by failures). Each model shown is at most
// policy.MaxModelBytes.
const MaxListedModelBreakers = 256

// Status reports the upstream's state as of now.
func (up *Upstream) Status(now time.Time) Status {
	state := up.State()
	s := Status{Name: up.name, URL: up.opts.URL, Breaker: state.String(), InFlight: up.inFlight.Load(),
		ModelBreakers: []ModelBreakerState{}, Endpoints: []EndpointStatus{}}
	s.MaxInFlight, s.SlotsInUse = cap(up.slots), len(up.slots)
	if n, until := up.cooldowns.Active(now); n > 0 {
		s.Cooldowns, s.CooldownUntil = n, &until
	}
	if up.limiter != nil {
		s.Limiter = &LimiterStatus{RequestsPerSecond: float64(up.limiter.Limit()), Burst: up.limiter.Burst(),
			Tokens: up.limiter.TokensAt(now)}
	}
	for _, mt := range up.tokens {
		st := mt.Window.State(now)
		s.TokensPerMinute = append(s.TokensPerMinute, TokenWindowStatus{Model: mt.Glob, Limit: st.Limit,
			Remaining: st.Remaining, Reserved: st.Reserved, ResetMS: st.Reset.Milliseconds()})
	}
	probe := time.Duration(-1)
	var models []listedModel
	for _, ep := range up.Endpoints() {
		es := endpointStatus(ep, now, up.slowStart)
		s.Endpoints = append(s.Endpoints, es)
		s.OpenConnections += es.OpenConnections
		if in, _ := ep.probeIn(now, "", up); state == breaker.StateOpen && (probe < 0 || in < probe) {
			probe = in
		}
		for _, m := range ep.models.Members(0) {
			models = append(models, listedModel{ep: ep, m: m, state: m.State(), failures: m.Counts().TotalFailures})
		}
		c := ep.breaker.Counts()
		s.Counts.Requests += c.Requests
		s.Counts.Successes += c.TotalSuccesses
		s.Counts.Failures += c.TotalFailures
		s.Counts.Exclusions += c.TotalExclusions
		s.Counts.ConsecutiveFailures = max(s.Counts.ConsecutiveFailures, c.ConsecutiveFailures)
	}
	for _, ep := range up.draining() { // DNS dropped them; their requests go on
		s.Endpoints = append(s.Endpoints, endpointStatus(ep, now, up.slowStart))
	}
	s.ProbeInMS = max(probe, 0).Milliseconds()
	s.ModelBreakers, s.ModelBreakersNotListed = worstModels(models, now)
	return s
}

// listedModel is a reply breaker as Status ranks it.
type listedModel struct {
	ep       *Endpoint
	m        *breaker.Member
	state    breaker.State
	failures uint32
}

// worstModels are the MaxListedModelBreakers worst of ms — open, then
// half-open, then closed; by failures within each — and how many are
// left out. Only those listed are described in full.
func worstModels(ms []listedModel, now time.Time) (out []ModelBreakerState, rest int) {
	rank := func(s breaker.State) int {
		switch s {
		case breaker.StateOpen:
			return 0
		case breaker.StateHalfOpen:
			return 1
		}
		return 2
	}
	slices.SortStableFunc(ms, func(a, b listedModel) int {
		return cmp.Or(cmp.Compare(rank(a.state), rank(b.state)), cmp.Compare(b.failures, a.failures))
	})
	rest = max(len(ms)-MaxListedModelBreakers, 0)
	out = make([]ModelBreakerState, 0, min(len(ms), MaxListedModelBreakers))
	for _, l := range ms[:len(ms)-rest] {
		out = append(out, ModelBreakerState{Endpoint: l.ep.addr, Model: l.m.Key, State: l.state.String(),
			ProbeInMS: l.m.ProbeIn(now).Milliseconds(), Failures: l.failures, TrippedOn: trippedOn(l.m.Breaker, l.state),
			Cause: l.m.Cause()})
	}
	return out, rest
}

// endpointStatus is what /debug/upstreams shows of ep (a formatter of
// its state, beside Status: the endpoint's own methods stay with it).
func endpointStatus(ep *Endpoint, now time.Time, slowStart time.Duration) EndpointStatus {
	b := ep.breaker.State()
	s := EndpointStatus{Address: ep.addr, State: "in", Breaker: b.String(), ProbeInMS: ep.breaker.ProbeIn(now).Milliseconds(),
		InFlight: ep.Load(), Weight: ep.weight(now, slowStart), OpenConnections: ep.client.ConnsCount(),
		Ejections: ep.ejections.Load(), Concurrency: ep.conc.status()}
	switch {
	case ep.draining.Load():
		s.State = "draining"
	case !ep.healthy.Load():
		s.State = "unhealthy"
	case b == breaker.StateOpen:
		s.State = "ejected"
	case b == breaker.StateHalfOpen:
		s.State = "probing"
	}
	if h := ep.health.Load(); h != nil {
		s.Health = *h
	}
	s.TrippedOn, s.Cause = trippedOn(ep.breaker, b), ep.breaker.Cause()
	return s
}

// trippedOn is what opened b (in state st) last, while it is not closed.
func trippedOn(b *breaker.Breaker, st breaker.State) *TripCounts {
	if c, ok := b.TrippedOn(); ok && st != breaker.StateClosed {
		return &TripCounts{Requests: c.Requests, Failures: c.TotalFailures, ConsecutiveFailures: c.ConsecutiveFailures}
	}
	return nil
}

// RefreshGauges brings the upstream's per-endpoint gauges up to date:
// an open breaker turns half-open lazily, when someone looks, and
// in-flight counts move with every request.
func (up *Upstream) RefreshGauges() {
	m := up.env.Metrics
	for _, ep := range up.Endpoints() {
		m.BreakerState.WithLabelValues(up.name, ep.addr).Set(float64(ep.breaker.State()))
		m.EndpointInFlight.WithLabelValues(up.name, ep.addr).Set(float64(ep.Load()))
		in := 1.0
		if ep.Out() {
			in = 0
		}
		m.EndpointUp.WithLabelValues(up.name, ep.addr).Set(in)
		if st := ep.conc.status(); st != nil {
			m.ConcurrencyLimit.WithLabelValues(up.name, ep.addr).Set(float64(st.Limit))
			for pr, n := range st.Queued {
				m.ConcurrencyQueued.WithLabelValues(up.name, ep.addr, Priority(pr).String()).Set(float64(n))
			}
		}
		up.refreshModelBreakers(ep)
	}
}

// refreshModelBreakers sets ep's sturdy_model_breaker_state series: one
// per model the config names that has a breaker there, and "other" for
// the worst of the rest (open if any client-chosen model's is).
func (up *Upstream) refreshModelBreakers(ep *Endpoint) {
	m := up.env.Metrics
	m.ModelBreakerState.DeletePartialMatch(prometheus.Labels{"upstream": up.name, "endpoint": ep.addr})
	worst := map[string]breaker.State{}
	for _, mb := range ep.models.Members(0) {
		label, st := up.env.ModelLabel(mb.Key), mb.State()
		if cur, ok := worst[label]; !ok || st > cur {
			worst[label] = st
		}
	}
	for label, st := range worst {
		m.ModelBreakerState.WithLabelValues(up.name, ep.addr, label).Set(float64(st))
	}
}
