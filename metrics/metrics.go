// Package metrics defines Sturdy's Prometheus metrics. Every name starts
// with sturdy_, counters end in _total and durations are _seconds
// histograms. Label values come only from config names (route, upstream),
// endpoint addresses (from the config or DNS discovery; a dropped
// endpoint's series are deleted) and fixed vocabularies (outcome, reason,
// status class), never from request data, so cardinality is bounded by
// the config and the pools.
//
// Upstream amplification is sturdy_upstream_attempts_total ÷
// sturdy_requests_total.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics holds the registry and every metric Sturdy exports.
type Metrics struct {
	// Registry is what the admin listener serves on /metrics.
	Registry *prometheus.Registry

	// Requests counts client requests by route, upstream, status class
	// (2xx … 5xx) and outcome.
	Requests *prometheus.CounterVec
	// Attempts counts upstream attempts by upstream, endpoint and result
	// (success, pass_through, 429, 5xx, connect, reset, timeout).
	Attempts *prometheus.CounterVec
	// Retries counts retries by upstream and reason.
	Retries *prometheus.CounterVec
	// RetryWait observes each wait before a retry, by upstream and source
	// (server: Retry-After; backoff: full jitter).
	RetryWait *prometheus.HistogramVec
	// GiveUps counts requests whose retries stopped early, by upstream and
	// stop reason (max_attempts, deadline, breaker_open …).
	GiveUps *prometheus.CounterVec
	// BreakerState is 0 closed, 1 half-open, 2 open, by upstream and
	// endpoint (its connection breaker).
	BreakerState *prometheus.GaugeVec
	// BreakerTransitions counts state changes by upstream, endpoint and
	// new state.
	BreakerTransitions *prometheus.CounterVec
	// ModelBreakerTransitions counts a model's reply breaker changes, by
	// upstream, endpoint, model (a name from the config, else "other") and
	// new state.
	ModelBreakerTransitions *prometheus.CounterVec
	// ModelBreakerState is a model's reply breaker on an endpoint: 0
	// closed, 1 half-open, 2 open, by upstream, endpoint and model (a name
	// from the config, else "other": the worst of the client-chosen
	// models' breakers).
	ModelBreakerState *prometheus.GaugeVec
	// EndpointInFlight is the requests in flight per endpoint (streams
	// included), by upstream and endpoint; EndpointUp is 1 while the
	// endpoint takes requests, 0 while it is out (breaker open, health
	// check failing, drained).
	EndpointInFlight *prometheus.GaugeVec
	EndpointUp       *prometheus.GaugeVec
	// ConcurrencyLimit and ConcurrencyQueued are an endpoint's concurrency
	// limit and its queue per class (refreshed on scrape);
	// ConcurrencyWait is the time requests waited in that queue, by
	// upstream; ConcurrencyShed counts the requests it turned away (full,
	// or their wait ran out), by upstream and class.
	ConcurrencyLimit  *prometheus.GaugeVec
	ConcurrencyQueued *prometheus.GaugeVec
	ConcurrencyWait   *prometheus.HistogramVec
	ConcurrencyShed   *prometheus.CounterVec
	// HealthChecks counts active health checks by upstream and result
	// (ok, fail).
	HealthChecks *prometheus.CounterVec
	// RideThroughs counts requests that waited for an endpoint to come
	// back (ride_through), by upstream.
	RideThroughs *prometheus.CounterVec
	// StreamRescues counts committed streams that failed mid-answer and
	// could be continued, by result (continued, failed, unsafe,
	// no_target, exhausted, interrupted).
	StreamRescues *prometheus.CounterVec
	// SharedStateUp is 1 while the fleet's Redis answers, 0 while not: it
	// is registered only while shared_state is on (EnableSharedState), so
	// a single replica has no series to alert on. SharedStateErrors counts
	// failed Redis calls by operation.
	SharedStateUp     prometheus.Gauge
	SharedStateErrors *prometheus.CounterVec
	// TimeToFirstByte observes the time until the client's response
	// started, by route.
	TimeToFirstByte *prometheus.HistogramVec
	// Duration observes whole requests, streams included, by route and
	// stream (true/false).
	Duration *prometheus.HistogramVec
	// InFlight is the number of requests being served.
	InFlight prometheus.Gauge
	// OpenStreams is the number of responses currently streaming.
	OpenStreams prometheus.Gauge
	// ConfigReloads counts reload attempts by result (ok, rejected).
	ConfigReloads *prometheus.CounterVec
	// Failovers counts moves from a route's target to the next, by route
	// and the upstream left.
	Failovers *prometheus.CounterVec
	// Cooldowns counts cooldowns learned from an upstream (a 429 with
	// Retry-After, or x-ratelimit-remaining-requests: 0), by upstream.
	Cooldowns *prometheus.CounterVec
	// BudgetExhausted counts retries refused by an upstream's retry
	// budget, by upstream.
	BudgetExhausted *prometheus.CounterVec
	// TargetSkips counts targets passed over without an attempt, by
	// upstream and reason (breaker_open, cooldown, rate_limited, busy).
	TargetSkips *prometheus.CounterVec
	// RateLimited counts 429s Sturdy answered itself, by reason (client,
	// client_tokens, client_spend, cooldown, rate_limited).
	RateLimited *prometheus.CounterVec
	// Tokens counts the tokens replies said they used, by route, upstream,
	// model (a configured name, else other) and kind (input, output) — of
	// the requests whose usage Sturdy reads (under a token budget, traced).
	Tokens *prometheus.CounterVec
	// Spend counts what those tokens cost at prices:, in USD, by route,
	// upstream and model.
	Spend *prometheus.CounterVec
	// AcceptErrors counts accept errors the listener retried, by reason
	// (emfile, enfile, econnaborted, enobufs, other).
	AcceptErrors *prometheus.CounterVec
	// ConnectionsRefused counts client connections answered 503 because
	// server.max_connections were open.
	ConnectionsRefused prometheus.Counter
	// ClientConnections is the number of open client connections.
	ClientConnections prometheus.Gauge
	// LeanClientConnections is the number of those served lean (fasthttp's
	// ReduceMemoryUsage): opened past server.reduce_memory_above, or every
	// one with server.reduce_memory. Set on scrape.
	LeanClientConnections prometheus.Gauge
	// ClientGone counts requests whose client left before their response
	// ended, by the phase they were in (queue, cooldown, pacing,
	// response_head, backoff, retry_after, stream).
	ClientGone *prometheus.CounterVec
	// StreamsUnterminated counts SSE/NDJSON streams that ended cleanly
	// (framed: chunked or with a length) without their terminator, by
	// route.
	StreamsUnterminated *prometheus.CounterVec
	// Evictions counts entries dropped from a bounded per-key map to make
	// room for a new key, by map (clients, cooldowns, model_breakers).
	Evictions *prometheus.CounterVec
	// BufferedBytes is the bytes held on behalf of clients now (of
	// server.max_buffered_bytes); BufferFull counts the times that budget
	// had no room, by use (hold, rescue, http10).
	BufferedBytes prometheus.Gauge
	BufferFull    *prometheus.CounterVec
	// Panics counts panics recovered, by where (request, stream, fleet):
	// each is a bug, logged with its stack, and the process serves on.
	Panics *prometheus.CounterVec
}

// latencyBuckets span a fast proxied call to a long generation.
var latencyBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// waitBuckets span full-jitter waits and server-given Retry-After.
var waitBuckets = []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2, 4, 8, 15, 30, 60}

// New creates the metrics in a fresh registry that also carries the Go
// runtime and process collectors.
//
// shape:long a flat registration list, one entry per metric.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_requests_total",
			Help: "Client requests by route, upstream, status class and outcome."},
			[]string{"route", "upstream", "code", "outcome"}),
		Attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_upstream_attempts_total",
			Help: "Attempts sent to upstreams, by upstream, endpoint and result."}, []string{"upstream", "endpoint", "result"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_retries_total",
			Help: "Retries by upstream and reason (429, 5xx, connect, reset, timeout)."}, []string{"upstream", "reason"}),
		RetryWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sturdy_retry_wait_seconds",
			Help: "Wait before each retry, by upstream and source (server or backoff).", Buckets: waitBuckets},
			[]string{"upstream", "source"}),
		GiveUps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_retry_stops_total",
			Help: "Requests whose retrying stopped on a retryable failure, by upstream and why."}, []string{"upstream", "stop"}),
		BreakerState: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sturdy_breaker_state",
			Help: "Connection breaker state per endpoint: 0 closed, 1 half-open, 2 open."}, []string{"upstream", "endpoint"}),
		BreakerTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_breaker_transitions_total",
			Help: "Connection breaker state changes, by upstream, endpoint and new state."}, []string{"upstream", "endpoint", "to"}),
		ModelBreakerTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_model_breaker_transitions_total",
			Help: "Reply breaker state changes per model, by upstream, endpoint, model (a config name, else other) and new state."},
			[]string{"upstream", "endpoint", "model", "to"}),
		ModelBreakerState: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sturdy_model_breaker_state",
			Help: "Reply breaker state per model on an endpoint (a config name, else other: the worst of the rest): 0 closed, 1 half-open, 2 open."},
			[]string{"upstream", "endpoint", "model"}),
		EndpointInFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sturdy_endpoint_in_flight",
			Help: "Requests in flight per endpoint, streams included."}, []string{"upstream", "endpoint"}),
		EndpointUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sturdy_endpoint_up",
			Help: "1 while the endpoint takes requests, 0 while it is out (breaker open, health check failing, drained)."},
			[]string{"upstream", "endpoint"}),
		ConcurrencyLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sturdy_concurrency_limit",
			Help: "An endpoint's concurrency limit (concurrency: fixed or adaptive)."}, []string{"upstream", "endpoint"}),
		ConcurrencyQueued: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sturdy_concurrency_queued",
			Help: "Requests waiting in an endpoint's concurrency queue, by class (interactive, batch)."},
			[]string{"upstream", "endpoint", "class"}),
		ConcurrencyWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sturdy_concurrency_wait_seconds",
			Help:    "Time requests waited in an endpoint's concurrency queue (those that got a place or were turned away).",
			Buckets: []float64{0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}}, []string{"upstream"}),
		ConcurrencyShed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_concurrency_shed_total",
			Help: "Requests an endpoint's concurrency queue turned away (full, or their wait ran out), by class."},
			[]string{"upstream", "class"}),
		HealthChecks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_health_checks_total",
			Help: "Active health checks by upstream and result (ok, fail)."}, []string{"upstream", "result"}),
		RideThroughs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_ride_throughs_total",
			Help: "Requests that waited for an endpoint to come back (ride_through), by upstream."}, []string{"upstream"}),
		SharedStateUp: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sturdy_shared_state_up",
			Help: "1 while the fleet's shared state (Redis) answers, 0 while it does not."}),
		SharedStateErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_shared_state_errors_total",
			Help: "Failed calls to the fleet's shared state (Redis), by operation."}, []string{"op"}),
		StreamRescues: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_stream_rescues_total",
			Help: "Streams cut mid-answer on a route that can continue them, by result."}, []string{"result"}),
		TimeToFirstByte: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sturdy_time_to_first_byte_seconds",
			Help: "Time until the client's response started (retries included), by route.", Buckets: latencyBuckets},
			[]string{"route"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sturdy_request_duration_seconds",
			Help: "Whole request duration, streams included, by route and stream.", Buckets: latencyBuckets},
			[]string{"route", "stream"}),
		InFlight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sturdy_in_flight_requests",
			Help: "Requests being served, streams included."}),
		OpenStreams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sturdy_open_streams",
			Help: "Responses currently streaming to clients."}),
		ConfigReloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_config_reloads_total",
			Help: "Config reloads by result (ok, rejected)."}, []string{"result"}),
		Failovers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_failovers_total",
			Help: "Moves to a route's next target, by route and the upstream left."}, []string{"route", "upstream"}),
		Cooldowns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_cooldowns_total",
			Help: "Cooldowns learned from an upstream's rate-limit answers, by upstream."}, []string{"upstream"}),
		BudgetExhausted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_retry_budget_exhausted_total",
			Help: "Retries refused because the upstream's retry budget was spent, by upstream."}, []string{"upstream"}),
		TargetSkips: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_target_skips_total",
			Help: "Targets passed over without an attempt, by upstream and reason."}, []string{"upstream", "reason"}),
		RateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_rate_limited_total",
			Help: "429s answered by Sturdy itself, by reason (client, client_tokens, client_spend, cooldown, rate_limited)."}, []string{"reason"}),
		Tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_tokens_total",
			Help: "Tokens replies said they used (requests under a token budget, or traced), by route, upstream, model and kind (input, output)."},
			[]string{"route", "upstream", "model", "kind"}),
		Spend: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_spend_usd_total",
			Help: "What replies' usage cost at prices: (requests whose usage Sturdy reads), USD, by route, upstream and model."},
			[]string{"route", "upstream", "model"}),
		AcceptErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_accept_errors_total",
			Help: "Accept errors on the client listener, retried with backoff, by reason."}, []string{"reason"}),
		ConnectionsRefused: prometheus.NewCounter(prometheus.CounterOpts{Name: "sturdy_connections_refused_total",
			Help: "Client connections answered 503 too_many_connections (server.max_connections)."}),
		ClientConnections: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sturdy_client_connections",
			Help: "Open client connections."}),
		LeanClientConnections: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sturdy_lean_client_connections",
			Help: "Open client connections served lean: opened past server.reduce_memory_above, or every one with server.reduce_memory."}),
		ClientGone: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_client_gone_total",
			Help: "Requests whose client left before the response ended, by phase."}, []string{"phase"}),
		StreamsUnterminated: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_stream_unterminated_total",
			Help: "SSE/NDJSON streams that ended cleanly without their terminator ([DONE], a final event), by route."}, []string{"route"}),
		Evictions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_evictions_total",
			Help: "Entries dropped from a bounded per-key map to make room for a new key, by map (clients, cooldowns, model_breakers)."},
			[]string{"map"}),
		BufferedBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sturdy_buffered_bytes",
			Help: "Bytes held on behalf of clients now (held stream heads, rescue text, HTTP/1.0 bodies), of server.max_buffered_bytes."}),
		Panics: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_panics_total",
			Help: "Panics recovered, by where (request, stream, fleet): each a bug, logged with its stack; the process served on."},
			[]string{"where"}),
		BufferFull: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sturdy_buffer_full_total",
			Help: "Times a buffer budget had no room, by use (hold: released early, rescue: unrescuable, http10: 502; request: server.max_request_bytes, 503)."},
			[]string{"use"}),
	}
	m.Registry.MustRegister(m.Requests, m.Attempts, m.Retries, m.RetryWait, m.GiveUps, m.BreakerState,
		m.BreakerTransitions, m.TimeToFirstByte, m.Duration, m.InFlight, m.OpenStreams, m.ConfigReloads,
		m.Failovers, m.Cooldowns, m.BudgetExhausted, m.TargetSkips, m.RateLimited, m.Tokens, m.Spend, m.AcceptErrors,
		m.ConnectionsRefused, m.ClientConnections, m.LeanClientConnections, m.StreamsUnterminated, m.ClientGone, m.ModelBreakerTransitions,
		m.EndpointInFlight, m.EndpointUp, m.HealthChecks, m.RideThroughs, m.StreamRescues, m.SharedStateErrors, m.ModelBreakerState,
		m.Evictions, m.BufferedBytes, m.BufferFull, m.Panics, m.ConcurrencyLimit, m.ConcurrencyQueued, m.ConcurrencyWait, m.ConcurrencyShed,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// EnableSharedState registers sturdy_shared_state_up (on) or takes it out
// of the registry (off): the series exists only while shared_state is on.
func (m *Metrics) EnableSharedState(on bool) {
	if on {
		_ = m.Registry.Register(m.SharedStateUp) // already registered: a reload that keeps it on
		return
	}
	m.Registry.Unregister(m.SharedStateUp)
}

// StatusClass returns "2xx" … "5xx" for a status (499 is "4xx").
func StatusClass(status int) string {
	switch {
	case status >= 500:
		return "5xx"
	case status >= 400:
		return "4xx"
	case status >= 300:
		return "3xx"
	case status >= 200:
		return "2xx"
	default:
		return "1xx"
	}
}
