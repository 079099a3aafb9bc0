package main

import (
	"fmt"
	"math"
	"strings"
	"time"

	"sturdy/internal/fakellm"
)

// settings are the knobs of a harness run (flags).
type settings struct {
	duration time.Duration // per load run
	rate     float64       // open-loop rate of the overhead latency run
	conns    int           // closed-loop connections of the overhead run
	streams  int           // concurrent streams of the streams scenario
	storm    int           // concurrent clients of the storm scenario
}

// runSpec is one load run of a scenario.
type runSpec struct {
	name   string
	path   string
	stream bool
	rate   float64
	conns  int
	once   bool
	// window, when set, is how long an open-loop run starts requests
	// (default: the run's duration).
	window time.Duration
	// body, when set, is the request body (default chatBody, or
	// streamBody for a stream).
	body []byte
}

// scenario is a named fault regime, the load to send through it, and the
// Sturdy settings it is measured with.
type scenario struct {
	name    string
	about   string
	profile func(s settings) fakellm.Profile
	runs    func(s settings) []runSpec
	// sturdy is the upstream/route YAML fragment (breaker, retry) used.
	sturdy string
	// timeouts are the upstream's (default: connect 1s, first_byte and
	// idle 30s).
	timeouts string
	// variants are Sturdy measured again with other fragments, each a
	// target of its own in the same run.
	variants []variant
	// redis, when set, starts a redis-server for the run: REDIS_URL in
	// the fragments (the scenario's and its variants') is its URL.
	redis bool
	// redisAddr is, once started (withRedis), the redis-server's address:
	// each slice counts the commands it ran (redisOps).
	redisAddr string
	// otlp, when set, starts an OTLP/HTTP sink for the run: OTLP_URL in
	// the fragments is its URL.
	otlp bool
	// pool, when set, gives Sturdy's upstream two endpoints, both the
	// one fake server (by address and by name).
	pool bool
	// replicas, when set, make the upstream a pool: a fake server per
	// replica instead of one with profile.
	replicas []replica
	// figures computes the scenario's own numbers from one run.
	figures func(s settings, run runSpec, recs []record, st fakellm.Stats) []figure
	// interleave says its faults do not depend on time, so -slices may
	// measure its targets in turns (runInterleaved).
	interleave bool
}

// overheadRuns are the load runs of a scenario without faults:
// capacity (closed loop), added latency at a fixed unsaturated rate, and
// streamed replies.
func overheadRuns(s settings) []runSpec {
	return []runSpec{
		{name: "capacity", path: "/v1/chat/completions", conns: s.conns},
		{name: fmt.Sprintf("latency@%g/s", s.rate), path: "/v1/chat/completions", rate: s.rate, conns: 512},
		{name: "streamed", path: "/v1/chat/completions", stream: true, conns: s.conns},
	}
}

// variant is Sturdy measured again in a scenario with another YAML
// fragment: the target sturdy+name.
type variant struct {
	name   string
	sturdy string
}

// of returns Sturdy's target t, renamed, started with v's fragment in place
// of the scenario's.
func (v variant) of(t target) target {
	start := t.start
	t.name = "sturdy+" + v.name
	t.start = func(sc *scenario, upstreams []string) (string, func(), error) {
		with := *sc
		with.sturdy = v.sturdy
		return start(&with, upstreams)
	}
	return t
}

// figure is one named result number.
type figure struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
}

var chatBody = []byte(`{"model":"fake-model","messages":[{"role":"system","content":"` + strings.Repeat("You are a careful assistant. ", 30) +
	`"},{"role":"user","content":"Summarise the state of the cluster in one line."}]}`) // ~1 KiB

var streamBody = []byte(`{"model":"fake-model","stream":true,"messages":[{"role":"user","content":"Tell me a story."}]}`)

// messagesBody is an Anthropic Messages API request (max_tokens is
// required there).
var messagesBody = []byte(`{"model":"fake-model","max_tokens":256,"messages":[{"role":"user","content":"Summarise the state of the cluster in one line."}]}`)

const flakyP = 0.20

var scenarios = []*scenario{
	{
		name:       "overhead",
		interleave: true,
		about: "no faults: capacity with 32 connections, added latency at a fixed unsaturated rate, streamed replies; " +
			"Sturdy with every feature configured (fullSturdy: a pool of two endpoints, health checks, per-model breakers, " +
			"cooldowns, retry budget, max_in_flight, client-gone watching, commit on content, shared_state idle, tracing off), " +
			"sturdy+rate_limit adding a rate limit that never binds (with shared_state: spent from leases), and " +
			"sturdy+reduce_memory with server.reduce_memory: true",
		profile: func(settings) fakellm.Profile { return fakellm.Profile{Tokens: 16} },
		runs:    overheadRuns,
		sturdy:  fullUpstream + fullSturdy,
		pool:    true,
		redis:   true,
		variants: []variant{{name: "rate_limit", sturdy: fullUpstream + fleetUpstream + fullSturdy},
			{name: "reduce_memory", sturdy: fullUpstream + fullSturdy + "server: {reduce_memory: true}\n"}},
	},
	{
		name:       "fleet",
		interleave: true,
		about: "no faults, a rate_limit that never binds: what a shared limit costs — each request's slot spent from a " +
			"lease of the fleet's limit in Redis (sturdy+shared_state) against the local limiter (sturdy)",
		profile: func(settings) fakellm.Profile { return fakellm.Profile{Tokens: 16} },
		runs: func(s settings) []runSpec {
			return []runSpec{
				{name: "capacity", path: "/v1/chat/completions", conns: s.conns},
				{name: fmt.Sprintf("latency@%g/s", s.rate/4), path: "/v1/chat/completions", rate: s.rate / 4, conns: 512},
			}
		},
		sturdy:   fleetUpstream + defaultSturdy,
		redis:    true,
		variants: []variant{{name: "shared_state", sturdy: fleetUpstream + "shared_state: {redis_url: REDIS_URL, timeout: 50ms}\n" + defaultSturdy}},
	},
	{
		name:       "tracing",
		interleave: true,
		about: "no faults: what tracing costs — every request traced, sampled and exported over OTLP/HTTP to a sink " +
			"(sturdy+tracing) against tracing off (sturdy)",
		profile:  func(settings) fakellm.Profile { return fakellm.Profile{Tokens: 16} },
		runs:     overheadRuns,
		sturdy:   defaultSturdy,
		otlp:     true,
		variants: []variant{{name: "tracing", sturdy: "tracing: {endpoint: OTLP_URL, sample_ratio: 1.0}\n" + defaultSturdy}},
	},
	{
		name: "flaky",
		about: "20 % transient faults (429 with retry-after-ms, 500, 502, 503, reset) at 300 req/s, on chat completions and " +
			"on Anthropic's Messages API (flaky/messages: the same faults in its shape, a 529 for the 503)",
		profile: func(settings) fakellm.Profile {
			q := flakyP / 5
			return fakellm.Profile{Seed: 42, Status: map[int]float64{429: q, 500: q, 502: q, 503: q}, Reset: q,
				RetryAfter: 5 * time.Millisecond, RetryAfterMS: true, Tokens: 8}
		},
		runs: func(s settings) []runSpec {
			return []runSpec{{name: "flaky", path: "/v1/chat/completions", rate: 300, conns: 512},
				{name: "flaky/messages", path: "/v1/messages", body: messagesBody, rate: 300, conns: 512}}
		},
		sturdy: `    breaker: {consecutive_failures: 50, failure_ratio: 0.9, min_requests: 1000}
routes:
  - name: default
    upstream: fake
    retry: {max_attempts: 4, base_delay: 5ms, max_delay: 50ms}
`,
		figures: func(_ settings, _ runSpec, recs []record, st fakellm.Stats) []figure {
			n := 4.0
			best := 1 - math.Pow(flakyP, n)
			return []figure{
				{"success", 100 * successRate(recs), "%"},
				{"theoretical_best", 100 * best, "%"},
				{"amplification", float64(st.Requests) / float64(len(recs)), "x"},
				{"expected_amplification", (1 - math.Pow(flakyP, n)) / (1 - flakyP), "x"},
			}
		},
	},
	{
		name:  "ratelimited",
		about: "30 % 429s with Retry-After: 1 — no retry may land before the server said it may",
		profile: func(settings) fakellm.Profile {
			return fakellm.Profile{Seed: 7, Status: map[int]float64{429: 0.3}, RetryAfter: time.Second, Tokens: 8}
		},
		runs: func(s settings) []runSpec {
			return []runSpec{{name: "ratelimited", path: "/v1/chat/completions", rate: 100, conns: 1024}}
		},
		// The fake server's 429s are per request, not per quota: nothing to
		// learn for the next request (see upstreams[].cooldown).
		sturdy: `    breaker: {consecutive_failures: 50}
    cooldown: {enabled: false}
routes:
  - name: default
    upstream: fake
    retry: {max_attempts: 4, max_retry_after: 5s}
`,
		figures: func(_ settings, _ runSpec, recs []record, st fakellm.Stats) []figure {
			return []figure{{"success", 100 * successRate(recs), "%"}, {"early_retries", float64(st.EarlyRetries), ""},
				{"amplification", float64(st.Requests) / float64(len(recs)), "x"}}
		},
	},
	{
		name: "outage",
		about: "the upstream is down for the middle third of the run: breaker reaction, fast-fail latency, recovery; " +
			"sturdy+ride_through waits for it instead (ride_through: 10s)",
		profile: func(s settings) fakellm.Profile {
			return fakellm.Profile{Tokens: 8, Outage: fakellm.Outage{From: s.duration / 3, To: 2 * s.duration / 3}}
		},
		runs: func(s settings) []runSpec {
			// Room for every request riding through the outage (ride_through).
			return []runSpec{{name: "outage", path: "/v1/chat/completions", rate: 200, conns: 4096}}
		},
		sturdy:   outageSturdy,
		variants: []variant{{name: "ride_through", sturdy: outageBreaker + "    ride_through: 10s\n" + outageRoute}},
		figures: func(s settings, _ runSpec, recs []record, st fakellm.Stats) []figure {
			from, to := s.duration/3, 2*s.duration/3
			open, recovered := -1.0, -1.0
			var fast []record
			for _, r := range recs {
				if r.fastFail {
					fast = append(fast, r)
					if open < 0 && r.at >= from {
						open = (r.at - from).Seconds()
					}
				}
				// By completion: a request riding through the outage
				// succeeds only once the upstream is back.
				if done := r.at + r.latency; ok(r) && done >= to && (recovered < 0 || (done-to).Seconds() < recovered) {
					recovered = (done - to).Seconds()
				}
			}
			ff := latencies(fast, all, total)
			return []figure{
				{"breaker_open_after", open, "s"}, {"fast_fail_p99", ms(ff, 99), "ms"}, {"fast_fails", float64(len(fast)), ""},
				{"upstream_requests_in_outage", float64(st.InOutage), ""}, {"recovered_after", recovered, "s"},
			}
		},
	},
	{
		name:  "storm",
		about: "many concurrent clients hammer an upstream that is down: upstream load must stay bounded",
		profile: func(s settings) fakellm.Profile {
			return fakellm.Profile{Tokens: 8, Outage: fakellm.Outage{From: 0, To: s.duration}}
		},
		runs: func(s settings) []runSpec {
			return []runSpec{{name: fmt.Sprintf("storm x%d", s.storm), path: "/v1/chat/completions", conns: s.storm}}
		},
		sturdy: outageSturdy,
		figures: func(s settings, _ runSpec, recs []record, st fakellm.Stats) []figure {
			secs := s.duration.Seconds()
			return []figure{{"client_rps", float64(len(recs)) / secs, "/s"}, {"upstream_rps", float64(st.InOutage) / secs, "/s"},
				{"upstream_per_client_request", float64(st.InOutage) / float64(max(len(recs), 1)), "x"}}
		},
	},
	{
		name:  "streams",
		about: "many concurrent SSE streams, opened over 2 s and all open together: time to first token, inter-chunk delay, memory per open stream",
		profile: func(s settings) fakellm.Profile {
			return fakellm.Profile{Tokens: 40, TTFT: fakellm.Latency{Base: 50 * time.Millisecond},
				InterToken: fakellm.Latency{Base: s.duration / 50}}
		},
		runs: func(s settings) []runSpec {
			window := min(2*time.Second, s.duration/4)
			return []runSpec{{name: fmt.Sprintf("%d streams", s.streams), path: "/v1/chat/completions", stream: true,
				conns: s.streams + 16, rate: float64(s.streams) / window.Seconds(), window: window}}
		},
		sturdy: defaultSturdy,
		figures: func(_ settings, _ runSpec, recs []record, _ fakellm.Stats) []figure {
			ttft := latencies(recs, ok, firstByte)
			var gaps time.Duration
			n := 0
			for _, r := range recs {
				if ok(r) && r.gap > 0 {
					gaps += r.gap
					n++
				}
			}
			return []figure{{"ttft_p50", ms(ttft, 50), "ms"}, {"ttft_p99", ms(ttft, 99), "ms"},
				{"mean_chunk_gap", float64(gaps) / float64(max(n, 1)) / 1e6, "ms"}, {"success", 100 * successRate(recs), "%"}}
		},
	},
	{
		name: "replicas",
		about: "a pool of four replicas — two healthy (25–35 ms), one 3× slower, one failing 30 % with 503 — at 200 req/s: " +
			"success, tail latency, each replica's share (direct: the first healthy replica alone)",
		replicas: []replica{
			{"healthy1", fakellm.Profile{Seed: 11, Tokens: 8, TTFT: replicaLatency}},
			{"healthy2", fakellm.Profile{Seed: 12, Tokens: 8, TTFT: replicaLatency}},
			{"slow", fakellm.Profile{Seed: 13, Tokens: 8, TTFT: fakellm.Latency{Base: 3 * replicaLatency.Base, Jitter: 3 * replicaLatency.Jitter}}},
			{"failing", fakellm.Profile{Seed: 14, Tokens: 8, TTFT: replicaLatency, Status: map[int]float64{503: 0.3}}},
		},
		runs: func(settings) []runSpec {
			return []runSpec{{name: "replicas", path: "/v1/chat/completions", rate: 200, conns: 512}}
		},
		sturdy: `    balance: least_requests
routes:
  - name: default
    upstream: fake
    retry: {max_attempts: 4, base_delay: 5ms, max_delay: 50ms}
`,
	},
}

// replicaLatency is a healthy replica's reply time in the replicas
// scenario: 25–35 ms, a short completion of a small model.
var replicaLatency = fakellm.Latency{Base: 25 * time.Millisecond, Jitter: 10 * time.Millisecond}

// fleetUpstream is the fleet scenario's rate_limit: far above any rate
// the machine reaches, so it costs its bookkeeping and never a wait.
const fleetUpstream = "    rate_limit: {requests_per_second: 1000000, burst: 100000, max_wait: 1s}\n"

// fullUpstream and fullSturdy are the overhead scenario's Sturdy: every
// feature a production config turns on, none of them binding in a run
// without faults. The two endpoints, health-checked, each have their
// connection breaker and a reply breaker per model; cooldowns are on (no
// 429 starts one); the retry budget is counted; max_in_flight slots are
// taken; each client connection is watched for leaving; streams commit on
// their first content; shared_state is configured (cooldowns and breaker
// hints would be shared) and idle; tracing is off.
const (
	fullUpstream = `    health_check: {path: /v1/models, every: 5s}
    breaker: {consecutive_failures: 5, failure_ratio: 0.5, min_requests: 20, window: 10s, open_for: 5s}
    retry_budget: {ratio: 0.2, min_per_second: 10}
    cooldown: {enabled: true, without_header: 1s}
    max_in_flight: 4096
`
	fullSturdy = `shared_state: {redis_url: REDIS_URL, timeout: 50ms, share_breakers: true}
routes:
  - name: default
    upstream: fake
    retry: {max_attempts: 3}
`
)

const defaultSturdy = `routes:
  - name: default
    upstream: fake
`

// outageBreaker and outageRoute make outageSturdy; the ride-through
// variant goes between them.
const (
	outageBreaker = "    breaker: {consecutive_failures: 5, open_for: 2s}\n"
	outageRoute   = `routes:
  - name: default
    upstream: fake
    retry: {max_attempts: 2, base_delay: 10ms, max_delay: 20ms}
`
	outageSturdy = outageBreaker + outageRoute
)

func successRate(recs []record) float64 {
	if len(recs) == 0 {
		return 0
	}
	n := 0
	for _, r := range recs {
		if ok(r) {
			n++
		}
	}
	return float64(n) / float64(len(recs))
}

func findScenario(name string) *scenario {
	for _, s := range scenarios {
		if s.name == name {
			return s
		}
	}
	return nil
}
