package proxy

import (
	"context"
	"net/netip"
	"time"

	"github.com/rs/zerolog"

	"sturdy/breaker"
	"sturdy/metrics"
	"sturdy/policy"
)

// Defaults of the options. A zero field means its default; where zero has
// a meaning of its own (no pacing, unlimited, off) its doc comment says so.
const (
	DefaultConnectTimeout   = 2 * time.Second
	DefaultFirstByteTimeout = 60 * time.Second
	DefaultIdleTimeout      = 30 * time.Second
	DefaultMaxConnections   = 512
	DefaultQueueTimeout     = 5 * time.Second
	DefaultPacingMaxWait    = 2 * time.Second
	DefaultBudgetRatio      = 0.5
	DefaultBudgetPerSecond  = 10
	DefaultDeadline         = 120 * time.Second
	DefaultMaxBody          = 32 << 20
	DefaultClientRetries    = 1
	DefaultKeyHeader        = "Authorization"
	DefaultReadTimeout      = 60 * time.Second
	DefaultServerIdle       = 120 * time.Second
	DefaultMaxHeaderBytes   = 32 << 10
	DefaultWriteTimeout     = 60 * time.Second
	DefaultMaxBufferedBytes = 256 << 20
	DefaultMaxDuration      = 10 * time.Minute
	DefaultBareCooldown     = time.Second
	DefaultCooldownMax      = 10 * time.Minute
	DefaultSlowStart        = 30 * time.Second
	DefaultMaxEjected       = 0.5
	DefaultMaxRescues       = 1
	DefaultMaxRescueBytes   = 1 << 20
	DefaultHealthEvery      = 5 * time.Second
	DefaultHealthTimeout    = time.Second
	DefaultHealthy          = 2
	DefaultUnhealthy        = 3
	DefaultDiscoverEvery    = 10 * time.Second
	// DefaultRideThroughQueue bounds the requests riding through an
	// outage when max_in_flight is unlimited.
	DefaultRideThroughQueue = 1024
)

// Upstream configures one model server.
type Upstream struct {
	// Name identifies the upstream in routes, logs and error bodies.
	Name string
	// URL is scheme://host[:port][/prefix]; the request URI is appended.
	// A pool of one: set URL, Endpoints or Discover.
	URL string
	// Endpoints are the replicas of a pool, each in URL's form.
	Endpoints []string
	// Discover finds the pool's endpoints in DNS instead.
	Discover Discover
	// Balance picks an endpoint for each attempt. Default least_requests.
	Balance Balance
	// Affinity keys requests for Balance affinity.
	Affinity Affinity
	// HealthCheck probes each endpoint; off when Path is empty.
	HealthCheck HealthCheck
	// SlowStart ramps a returning endpoint's share up over this long.
	// Default 30 s; negative: no ramp.
	SlowStart time.Duration
	// MaxEjected is the share of the pool its breakers may take out at
	// once (always at least one endpoint). Default 0.5.
	MaxEjected float64
	// RideThrough, when set, makes a request wait this long (within its
	// deadline) for an endpoint to come back when every one is out,
	// instead of failing at once; 0: off.
	RideThrough time.Duration
	// Continuation says how the upstream continues a partial assistant
	// message, for rescuing a stream cut mid-answer (ContinueNone: it is
	// never asked to).
	Continuation Continuation
	// APIKey, when set, replaces the client's Authorization header.
	APIKey string
	// ConnectTimeout bounds dialling and the TLS handshake. Default 2 s.
	ConnectTimeout time.Duration
	// FirstByteTimeout runs from sending the request to the first body
	// byte. Default 60 s.
	FirstByteTimeout time.Duration
	// IdleTimeout bounds each gap between reads of a streamed body.
	// Default 30 s.
	IdleTimeout time.Duration
	// MaxConnections caps open connections (one per in-flight request).
	// Default 512.
	MaxConnections int
	// Breaker configures the upstream's circuit breaker; its zero fields
	// take breaker's defaults.
	Breaker breaker.Settings
	// RateLimit paces requests to the upstream; zero RequestsPerSecond
	// means no pacing.
	RateLimit RateLimit
	// MaxInFlight caps concurrent requests (streams included); 0 means
	// unlimited.
	MaxInFlight int
	// QueueTimeout is how long a request waits for a slot under
	// MaxInFlight. Default 5 s.
	QueueTimeout time.Duration
	// RetryBudget caps retries to the upstream.
	RetryBudget RetryBudget
	// Cooldown says how the upstream's 429s are learned.
	Cooldown Cooldown
	// CAFile adds PEM CAs to trust for an https upstream.
	CAFile string
	// InsecureSkipVerify turns off TLS verification of the upstream.
	InsecureSkipVerify bool
}

// withDefaults returns u with its zero fields set to their defaults.
func (u Upstream) withDefaults() Upstream {
	orDefault(&u.ConnectTimeout, DefaultConnectTimeout)
	orDefault(&u.FirstByteTimeout, DefaultFirstByteTimeout)
	orDefault(&u.IdleTimeout, DefaultIdleTimeout)
	orDefault(&u.MaxConnections, DefaultMaxConnections)
	orDefault(&u.QueueTimeout, DefaultQueueTimeout)
	if u.RateLimit.RequestsPerSecond > 0 {
		orDefault(&u.RateLimit.MaxWait, DefaultPacingMaxWait)
		orDefault(&u.RateLimit.Burst, burstFor(u.RateLimit.RequestsPerSecond))
	}
	orDefault(&u.RetryBudget.Ratio, DefaultBudgetRatio)
	orDefault(&u.RetryBudget.MinPerSecond, DefaultBudgetPerSecond)
	orDefault(&u.Cooldown.WithoutHeader, DefaultBareCooldown)
	orDefault(&u.Cooldown.Max, DefaultCooldownMax)
	if u.SlowStart == 0 {
		u.SlowStart = DefaultSlowStart
	}
	orDefault(&u.MaxEjected, DefaultMaxEjected)
	if u.HealthCheck.Path != "" {
		orDefault(&u.HealthCheck.Every, DefaultHealthEvery)
		orDefault(&u.HealthCheck.Timeout, DefaultHealthTimeout)
		orDefault(&u.HealthCheck.Healthy, DefaultHealthy)
		orDefault(&u.HealthCheck.Unhealthy, DefaultUnhealthy)
	}
	if u.Discover.DNS != "" {
		orDefault(&u.Discover.Every, DefaultDiscoverEvery)
		orDefault(&u.Discover.Scheme, "http")
	}
	return u
}

// Continuation is how an upstream continues a partial assistant message
// sent as the conversation's last message.
type Continuation uint8

// The ways of continuing.
const (
	// ContinueNone: the upstream is never sent a partial answer.
	ContinueNone Continuation = iota
	// ContinueVLLM: vLLM's continue_final_message: true with
	// add_generation_prompt: false.
	ContinueVLLM
	// ContinuePrefill: the trailing assistant message alone (llama.cpp,
	// Ollama and Anthropic-style servers continue it).
	ContinuePrefill
)

// StreamHold holds a committed stream's status and headers until the
// stream ends or its window passes, so a failure inside the window is
// retried from scratch, unseen. Off when both are zero.
type StreamHold struct {
	// Max is the window's length from the stream's first output. Default
	// 2 s when Bytes is set.
	Max time.Duration
	// Bytes ends the window once this much of the body is held. Default
	// 64 KiB when Max is set.
	Bytes int
}

// The stream_hold defaults.
const (
	DefaultStreamHoldMax   = 2 * time.Second
	DefaultStreamHoldBytes = 64 << 10
)

// ServerLimits bound how clients use the listener (fixed at New).
type ServerLimits struct {
	// ReadTimeout bounds reading a whole request, headers and body.
	// Default 60 s.
	ReadTimeout time.Duration
	// IdleTimeout bounds a keep-alive connection between requests.
	// Default 120 s.
	IdleTimeout time.Duration
	// MaxHeaderBytes caps the request line and headers (431 above).
	// Default 32 KiB.
	MaxHeaderBytes int
	// MaxConnections caps open client connections; one more is answered
	// 503 too_many_connections. Default: half the file descriptors the
	// process may open (less 128: files, listeners, logs and the admin
	// listener's AdminConnections), leaving the other half for upstream
	// connections, at most 65,536.
	MaxConnections int
	// WriteTimeout is the longest a single write to a client may block
	// (nginx's send_timeout): a client that stops reading is cut. It
	// never caps a stream that the client keeps reading. Default 60 s.
	WriteTimeout time.Duration
	// MaxBufferedBytes bounds the bytes held on behalf of clients, all
	// requests together: streams' heads held before and past their commit
	// point, rescue text, bodies read whole for HTTP/1.0 clients. Default
	// 256 MiB; unlike the other limits it hot-reloads (Reload).
	MaxBufferedBytes int64
}

func (s ServerLimits) withDefaults() ServerLimits {
	orDefault(&s.ReadTimeout, DefaultReadTimeout)
	orDefault(&s.IdleTimeout, DefaultServerIdle)
	orDefault(&s.MaxHeaderBytes, DefaultMaxHeaderBytes)
	orDefault(&s.MaxConnections, defaultMaxConnections(openFileLimit()))
	orDefault(&s.WriteTimeout, DefaultWriteTimeout)
	if s.MaxBufferedBytes <= 0 {
		s.MaxBufferedBytes = DefaultMaxBufferedBytes
	}
	return s
}

// AdminConnections is how many connections the admin listener may hold
// open at once: they come out of the same file descriptors.
const AdminConnections = 64

// reservedFDs are the file descriptors defaultMaxConnections leaves out:
// 64 for files, listeners and logs, and the admin listener's.
const reservedFDs = 64 + AdminConnections

// defaultMaxConnections leaves half of the file descriptor limit (less
// reservedFDs) to client connections: each request in flight also holds
// one upstream connection.
func defaultMaxConnections(fdLimit uint64) int {
	return int(min(max(16, (min(fdLimit, 1<<30)-min(fdLimit, reservedFDs))/2), maxDefaultConnections))
}

// maxDefaultConnections caps the derived default: each connection holds
// tens of KiB of buffers, so a million-descriptor limit would let memory
// run out first.
const maxDefaultConnections = 65536

// RateLimit paces requests below a provider's quota.
type RateLimit struct {
	// RequestsPerSecond is the sustained rate; 0 means no pacing.
	RequestsPerSecond float64
	// Burst is how many requests may go at once. Default: the rate
	// rounded up, at least 1.
	Burst int
	// MaxWait is the longest a request waits for its turn. Default 2 s.
	MaxWait time.Duration
}

// Balance is how a pool picks an endpoint.
type Balance uint8

// The balancers.
const (
	// BalanceLeastRequests: the power of two choices by requests in flight
	// (the default).
	BalanceLeastRequests Balance = iota
	// BalanceRoundRobin: each endpoint in turn.
	BalanceRoundRobin
	// BalanceAffinity: the same key to the same endpoint, with bounded
	// load (policy.PickAffinity).
	BalanceAffinity
)

// Affinity says what keys a request for BalanceAffinity: a header's
// value, or the first Prefix bytes of the messages' roles and contents
// in order (what a server's prefix cache keys on).
type Affinity struct {
	Header string
	Prefix int
}

// HealthCheck probes every endpoint with a GET of Path: Unhealthy
// failures in a row take it out, Healthy successes bring it back.
// Defaults: every 5 s, timeout 1 s, healthy 2, unhealthy 3.
type HealthCheck struct {
	Path               string
	Every, Timeout     time.Duration
	Healthy, Unhealthy int
}

// Discover resolves DNS every Every (default 10 s) for the pool's
// endpoints: DNS is host:port, Scheme http (default) or https (verified
// against the DNS name, never the resolved address).
type Discover struct {
	DNS    string
	Scheme string
	Every  time.Duration
}

// Cooldown configures what an upstream's rate limits teach Sturdy: a 429
// with Retry-After, x-ratelimit-remaining-*: 0, or a 429 without a wait
// puts the (credential, model) in cooldown, so other requests do not
// rediscover it.
type Cooldown struct {
	// Off learns nothing: for servers whose 429s are per request, not per
	// quota. Default: on.
	Off bool
	// WithoutHeader is the first cooldown of a 429 that gives no wait; it
	// doubles for each such 429 in a row (up to 60 s) and a success ends
	// the run. Default 1 s.
	WithoutHeader time.Duration
	// Max caps every cooldown learned (from any header: Retry-After,
	// x-ratelimit-reset-*) or adopted from the fleet, so one reply
	// cannot lock a credential out for long. Default 10 minutes.
	Max time.Duration
}

// RetryBudget caps retries: within 10 s they may add Ratio of the first
// attempts plus MinPerSecond per second. Defaults 0.5 and 10.
type RetryBudget struct {
	Ratio        float64
	MinPerSecond float64
}

// Target is a fallback: an upstream, with the body's "model" rewritten to
// Model when set.
type Target struct {
	Upstream string
	Model    string
}

// ClientLimit rate-limits each client, told apart by KeyHeader's value.
type ClientLimit struct {
	// KeyHeader names the header that tells clients apart. Default
	// Authorization.
	KeyHeader string
	// RequestsPerSecond is each client's sustained rate (> 0).
	RequestsPerSecond float64
	// Burst is how many requests a client may send at once. Default: the
	// rate rounded up, at least 1.
	Burst int
}

func (c ClientLimit) withDefaults() ClientLimit {
	orDefault(&c.KeyHeader, DefaultKeyHeader)
	orDefault(&c.Burst, burstFor(c.RequestsPerSecond))
	return c
}

// Route sends requests whose path starts with PathPrefix to Upstream.
type Route struct {
	// Name identifies the route in logs.
	Name string
	// PathPrefix is matched bytewise against the raw request path; the
	// longest match wins. Default "/".
	PathPrefix string
	// Model, when set, is a glob the body's "model" must match.
	Model string
	// Upstream is an Upstream's Name: the primary target.
	Upstream string
	// Fallbacks are tried in order after Upstream.
	Fallbacks []Target
	// FirstToken, when set, bounds each attempt's wait for its first body
	// byte below the upstream's FirstByteTimeout, for streamed requests;
	// 0 means off.
	FirstToken time.Duration
	// FailoverOn lists 4xx statuses that move to the next target.
	FailoverOn []int
	// FailoverCodes lists 400 error codes that move to the next target.
	FailoverCodes []string
	// AttemptsOnClientRetry caps attempts per target when the client is
	// retrying on its own (X-Stainless-Retry-Count > 0). Default 1.
	AttemptsOnClientRetry int
	// Deadline is the budget until the response starts, retries included.
	// Default 120 s.
	Deadline time.Duration
	// MaxBody is the largest request body accepted, in bytes. Default
	// 32 MiB.
	MaxBody int
	// MaxDuration caps a whole response, from the request's start to the
	// end of its body; past it the body is cut (a stream gets its
	// interruption event). Zero: 10 minutes for a non-streamed reply
	// (known length, not SSE or NDJSON), no cap for a stream.
	MaxDuration time.Duration
	// Retry is the route's retry policy; its zero fields take policy's
	// defaults (Retry.WithDefaults).
	Retry policy.Retry
	// StreamHold holds a stream's head until it ends or its window
	// passes (off when zero).
	StreamHold StreamHold
	// MaxRescues bounds the continuations of one request's stream cut
	// mid-answer. 0: the default, 1; negative: none.
	MaxRescues int
	// MaxRescueBytes bounds the text a rescuable stream keeps for its
	// continuation; past it the stream goes on unrescuable. Default 1 MiB.
	MaxRescueBytes int
}

func (r Route) withDefaults() Route {
	orDefault(&r.PathPrefix, "/")
	orDefault(&r.AttemptsOnClientRetry, DefaultClientRetries)
	orDefault(&r.Deadline, DefaultDeadline)
	orDefault(&r.MaxBody, DefaultMaxBody)
	r.Retry = r.Retry.WithDefaults(len(r.Fallbacks))
	if r.StreamHold != (StreamHold{}) {
		orDefault(&r.StreamHold.Max, DefaultStreamHoldMax)
		orDefault(&r.StreamHold.Bytes, DefaultStreamHoldBytes)
	}
	orDefault(&r.MaxRescueBytes, DefaultMaxRescueBytes)
	switch {
	case r.MaxRescues == 0:
		r.MaxRescues = DefaultMaxRescues
	case r.MaxRescues < 0:
		r.MaxRescues = 0
	}
	return r
}

// Options configures a Proxy.
type Options struct {
	// SharedState, when set, shares cooldowns, limits and breaker hints
	// with the fleet's other replicas through Redis.
	SharedState *SharedState
	// Tracing, when set, traces every request with OpenTelemetry.
	Tracing   *Tracing
	Upstreams []Upstream
	Routes    []Route
	// Clients are per-client rate limits every request must pass.
	Clients []ClientLimit
	// AuthKeys, when set, are the keys clients must present as
	// "Authorization: Bearer <key>"; the client's Authorization is then
	// never forwarded upstream.
	AuthKeys []string
	// Server bounds the client-facing listener (fixed at New).
	Server ServerLimits
	// TrustedProxies are the peers (say, a load balancer) whose
	// X-Forwarded-For, -Host and -Proto are kept, Sturdy appending its
	// peer; from any other peer they are replaced by what Sturdy saw.
	// Empty: nobody is trusted.
	TrustedProxies []netip.Prefix
	// Log receives access lines and breaker transitions.
	Log zerolog.Logger
	// Rand returns a uniform value in [0, n) for backoff jitter; nil means
	// math/rand/v2.
	Rand func(n int64) int64
	// Metrics receives the proxy's measurements; nil means a private set.
	Metrics *metrics.Metrics
	// LookupHost resolves the names of DNS discovery; nil means
	// net.DefaultResolver.LookupHost (fixed at New).
	LookupHost func(ctx context.Context, host string) ([]string, error)
	// IsSelf reports whether an endpoint address DNS discovery found
	// (host:port) is Sturdy's own listener: such an endpoint is left out
	// of its pool, with a warning, since every request sent there would
	// come back. nil: none is (fixed at New).
	IsSelf func(addr string) bool
}

// orDefault sets *v to def when it is zero (or negative).
func orDefault[T int | float64 | time.Duration | string](v *T, def T) {
	var zero T
	if *v == zero || (*v < zero) {
		*v = def
	}
}

// burstFor is the default burst of a rate: one second's worth, at least 1.
func burstFor(rps float64) int {
	b := int(rps)
	if float64(b) < rps {
		b++
	}
	return max(b, 1)
}
