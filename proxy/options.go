package proxy

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/rs/zerolog"

	"sturdy/listener"
	"sturdy/metrics"
	"sturdy/policy"
	"sturdy/units"
	"sturdy/upstream"
)

// Defaults of the options. A zero field means its default; where zero has
// a meaning of its own (no pacing, unlimited, off) its doc comment says so.
const (
	DefaultDeadline         = 120 * time.Second
	DefaultMaxBody          = 32 << 20
	DefaultClientRetries    = 1
	DefaultKeyHeader        = "Authorization"
	DefaultReadTimeout      = 60 * time.Second
	DefaultServerIdle       = 120 * time.Second
	DefaultMaxHeaderBytes   = 32 << 10
	DefaultWriteTimeout     = 60 * time.Second
	DefaultMaxBufferedBytes = 256 << 20
	// DefaultMaxRequestBytes is ServerLimits.MaxRequestBytes's default.
	DefaultMaxRequestBytes = 512 << 20
	// DefaultReduceMemoryAbove is ServerLimits.ReduceMemoryAbove's
	// default: the first thousand connections are served at full speed.
	DefaultReduceMemoryAbove = 1000
	DefaultMaxDuration       = 10 * time.Minute
	DefaultMaxRescues        = 1
	DefaultMaxRescueBytes    = 1 << 20
)

// StreamHold holds a committed stream's status and headers until the
// stream ends or its window passes, so a failure inside the window is
// retried from scratch, unseen. Off when both are zero.
type StreamHold struct {
	// Max is the window's length from the stream's first output; either
	// key alone turns the hold on. Default 2s.
	Max time.Duration `yaml:"max"`
	// Bytes ends the window once this much of the body is held (at most
	// 16MiB); either key alone turns the hold on. Default 64KiB.
	Bytes units.Size `yaml:"bytes"`
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
	// MaxRequestBytes bounds the request bodies held, all requests in
	// flight together: past it a request gets 503 server_busy, before
	// its body is read when it has a Content-Length. Default 512 MiB;
	// hot-reloads (Reload).
	MaxRequestBytes int64
	// ReduceMemory releases an idle keep-alive connection's context and
	// buffers between requests (fasthttp's ReduceMemoryUsage): less
	// memory per idle connection, more CPU per request. Default off.
	ReduceMemory bool
	// ReduceMemoryAbove is how many client connections may be open before
	// the next one opened is served as with ReduceMemory (each keeps that
	// way for its life): a few connections are served at full speed, a
	// crowd of idle ones costs half the memory. Counted per listener, as
	// MaxConnections is. Default 1,000; at MaxConnections or above, never.
	ReduceMemoryAbove int
}

func (s ServerLimits) withDefaults() ServerLimits {
	upstream.OrDefault(&s.ReadTimeout, DefaultReadTimeout)
	upstream.OrDefault(&s.IdleTimeout, DefaultServerIdle)
	upstream.OrDefault(&s.MaxHeaderBytes, DefaultMaxHeaderBytes)
	upstream.OrDefault(&s.MaxConnections, defaultMaxConnections(listener.OpenFileLimit()))
	upstream.OrDefault(&s.WriteTimeout, DefaultWriteTimeout)
	upstream.OrDefault(&s.MaxBufferedBytes, DefaultMaxBufferedBytes)
	upstream.OrDefault(&s.MaxRequestBytes, DefaultMaxRequestBytes)
	upstream.OrDefault(&s.ReduceMemoryAbove, DefaultReduceMemoryAbove)
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

// Target is a fallback: an upstream, with the body's "model" rewritten to
// Model when set.
type Target struct {
	// Upstream is the fallback's upstream, by name. Required.
	Upstream string `yaml:"upstream"`
	// Model, when set, rewrites the body's "model" for this target;
	// unset, the model goes as the client sent it. Default none.
	Model string `yaml:"model"`
}

// ClientLimit rate-limits each client, told apart by KeyHeader's value:
// the config file's clients[] entries decode into it (its yaml keys).
type ClientLimit struct {
	// KeyHeader names the header whose value, hashed, tells clients
	// apart. Authorization means the request's credential (Authorization,
	// else x-api-key). Requests without it share one bucket. Default
	// Authorization.
	KeyHeader string `yaml:"key_header"`
	// RequestsPerSecond is each client's sustained request rate; past it,
	// 429 rate_limited at once. 0: no request limit (the entry sets a
	// budget instead). Default 0.
	RequestsPerSecond float64 `yaml:"requests_per_second"`
	// Burst is how many requests a client may send at once. Default: the
	// rate rounded up, at least 1.
	Burst int `yaml:"burst"`
	// TokenLimits are each client's token budgets.
	TokenLimits `yaml:",inline"`
	// Spend is each client's spend budget, priced by prices; past it,
	// 429 budget_exceeded. With shared_state it is the fleet's, else this
	// replica's, in memory. Default none.
	Spend Spend `yaml:"spend"`
}

// Spend is a client's spend budget: at most USD a Period — "day" or
// "month", UTC — of what its replies' usage costs at Options.Prices.
// Zero USD: none.
type Spend struct {
	// USD is the most a client may spend a period, in US dollars; 0: no
	// budget. Default 0.
	USD float64 `yaml:"usd"`
	// Period is the budget's span: day or month, in UTC. Default day.
	Period string `yaml:"period"`
}

// Price is what a model's tokens cost, in USD per million.
type Price struct {
	// Input is the price of a million input tokens, in USD. Default 0.
	Input float64 `yaml:"input"`
	// Output is the price of a million output tokens, in USD. Default 0.
	Output float64 `yaml:"output"`
}

// TokenLimits are a client's token budgets, in tokens a minute (a sliding
// minute: policy.TokenWindow); 0: no such budget. A request reserves its
// estimate of each at admission and settles to its reply's usage.
type TokenLimits struct {
	// TokensPerMinute is a budget of input and output tokens together, a
	// sliding minute; 0: none. Default 0.
	TokensPerMinute int64 `yaml:"tokens_per_minute"`
	// InputTokensPerMinute is a budget of input tokens, a sliding
	// minute; 0: none. Default 0.
	InputTokensPerMinute int64 `yaml:"input_tokens_per_minute"`
	// OutputTokensPerMinute is a budget of output tokens, a sliding
	// minute; 0: none. Default 0.
	OutputTokensPerMinute int64 `yaml:"output_tokens_per_minute"`
}

// limit is the budget of kind k in t (0: none).
func (t TokenLimits) limit(k tokenKind) int64 {
	return [tokenKinds]int64{t.TokensPerMinute, t.InputTokensPerMinute, t.OutputTokensPerMinute}[k]
}

// any reports whether some budget is set.
func (t TokenLimits) any() bool {
	return t.TokensPerMinute > 0 || t.InputTokensPerMinute > 0 || t.OutputTokensPerMinute > 0
}

// or is t with each budget it leaves unset taken from base.
func (t TokenLimits) or(base TokenLimits) TokenLimits {
	upstream.OrDefault(&t.TokensPerMinute, base.TokensPerMinute)
	upstream.OrDefault(&t.InputTokensPerMinute, base.InputTokensPerMinute)
	upstream.OrDefault(&t.OutputTokensPerMinute, base.OutputTokensPerMinute)
	return t
}

func (c ClientLimit) withDefaults() ClientLimit {
	upstream.OrDefault(&c.KeyHeader, DefaultKeyHeader)
	if c.Spend.USD > 0 {
		upstream.OrDefault(&c.Spend.Period, "day")
	}
	if c.RequestsPerSecond > 0 {
		upstream.OrDefault(&c.Burst, upstream.BurstFor(c.RequestsPerSecond))
	}
	return c
}

// MaxClientKeys bounds the keys client_keys_file may list.
const MaxClientKeys = upstream.MaxTrackedKeys

// ClientKey is one client key's own settings (client_keys_file's keys[]
// entries decode into it): the key is the request's credential — its
// Bearer token, else its x-api-key — named by its SHA-256 or given
// through ${VAR}, never written in the file itself.
type ClientKey struct {
	// SHA256 is the key's SHA-256, in hex; Key is the key itself, written
	// as ${VAR} (the environment's value). Exactly one of the two.
	SHA256 string `yaml:"sha256"`
	Key    string `yaml:"key"`
	// Name labels the key in the access line (client_key); it is not a
	// secret.
	Name string `yaml:"name"`
	// Priority is the key's requests' class in a concurrency queue:
	// batch pins it there (x-sturdy-priority cannot raise it);
	// interactive lifts a batch route's (the header may still lower it).
	// Unset: the route's.
	Priority *upstream.Priority `yaml:"priority"`
	// RequestsPerSecond and Burst are the key's own rate limit (burst
	// defaults to the rate rounded up), and TokenLimits its own token
	// budgets: a key with any of them is limited by its own, in place of
	// the first clients: entry keyed by credential (the default
	// key_header), whose settings fill those the key leaves unset; the
	// key's limits stand alone where there is no such entry.
	RequestsPerSecond float64 `yaml:"requests_per_second"`
	Burst             int     `yaml:"burst"`
	TokenLimits       `yaml:",inline"`
	Spend             Spend `yaml:"spend"`
}

// Route sends requests whose path starts with PathPrefix to Upstream. It
// is the one shape of a route: the config file's routes[] entries decode
// into it (the yaml keys below; package config validates it, with key and
// line), and the proxy compiles it (buildRoute).
type Route struct {
	// Name identifies the route in logs. Required.
	Name string `yaml:"name"`
	// PathPrefix is matched bytewise against the raw request path, not
	// stripped; the longest match wins. Default `/`.
	PathPrefix string `yaml:"path_prefix"`
	// Model is a glob (* and ?) the body's "model" must match:
	// among routes with the longest matching path_prefix, one whose glob
	// matches beats one without, a glob with more literal characters a
	// shorter one. Default any.
	Model string `yaml:"model"`
	// Upstream is the primary target, an upstream's name. Required.
	Upstream string `yaml:"upstream"`
	// Fallbacks are the targets tried in order once the primary cannot
	// answer. Default none.
	Fallbacks []Target `yaml:"fallbacks"`
	// FirstToken bounds, for streamed requests, each attempt's wait for
	// its first output (the commit point) below the upstream's
	// first_byte timeout; past it the attempt is abandoned. 0s: off.
	// Default off.
	FirstToken time.Duration `yaml:"first_token"`
	// FailoverOn lists 4xx statuses that move to the next target instead
	// of passing through. Default none.
	FailoverOn []int `yaml:"failover_on"`
	// FailoverCodes lists error codes of a 400 body (OpenAI's error.code,
	// Anthropic's error.type) that move to the next target. Default none.
	FailoverCodes []string `yaml:"failover_codes"`
	// Deadline is the budget until the response starts, retries and
	// waits included. Default 120s.
	Deadline time.Duration `yaml:"deadline"`
	// MaxBody is the largest request body accepted; larger gets 413.
	// Raising it above the largest at start needs a restart. Default
	// 32MiB.
	MaxBody units.Size `yaml:"max_body"`
	// MaxDuration caps a whole response, from the request's start to the
	// end of its body; past it the body is cut (a stream gets its
	// interruption event). Written, it caps streams too. Default: `10m`
	// for a non-streamed reply, none for a stream.
	MaxDuration time.Duration `yaml:"max_duration"`
	// Retry is the route's retry policy.
	Retry Retry `yaml:"retry"`
	// StreamHold holds an inference stream's status and headers past its
	// first output until it ends, max passes or bytes are held: a failure
	// inside is retried unseen, at the cost of a later first token.
	// Default off.
	StreamHold StreamHold `yaml:"stream_hold"`
	// MaxRescues bounds the continuations of one request's stream cut
	// mid-answer, on a target with continuation set; 0: none. Default 1.
	MaxRescues *int `yaml:"max_rescues"`
	// MaxRescueBytes bounds the text a rescuable stream keeps for its
	// continuation; past it the stream goes on unrescuable
	// (rescue_refused: too_large). Default 1MiB.
	MaxRescueBytes units.Size `yaml:"max_rescue_bytes"`
	// Priority is the class of the route's requests in an endpoint's
	// concurrency queue: interactive or batch. Default interactive.
	Priority upstream.Priority `yaml:"priority"`
	// PriorityHeader lets a request say its own class in
	// x-sturdy-priority (interactive or batch). Default false.
	PriorityHeader bool `yaml:"priority_header"`
}

// Retry is a route's retry policy as written; its zero fields take
// policy's defaults (policy.Retry.WithDefaults).
type Retry struct {
	// MaxAttempts counts the first attempt, per target; 1: no retries.
	// Default 4.
	MaxAttempts int `yaml:"max_attempts"`
	// BaseDelay is the full-jitter bound before the first retry, doubling
	// per retry up to max_delay. Default 250ms.
	BaseDelay time.Duration `yaml:"base_delay"`
	// MaxDelay caps the full-jitter bound (never below base_delay).
	// Default 8s.
	MaxDelay time.Duration `yaml:"max_delay"`
	// MaxRetryAfter is the longest server-given wait honoured; a longer
	// one goes back to the client. Default 30s.
	MaxRetryAfter time.Duration `yaml:"max_retry_after"`
	// On lists what is retried: 429, 5xx, connect, reset, timeout.
	// Default: all five.
	On []string `yaml:"on"`
	// ReplayWrites retries non-inference writes (files, batches) on every
	// reason, not only when the connection never opened. Default false.
	ReplayWrites bool `yaml:"replay_writes"`
	// MaxTotalAttempts caps attempts across all targets. Default:
	// max_attempts plus the number of fallbacks.
	MaxTotalAttempts int `yaml:"max_total_attempts"`
	// OnTimeout is what follows a timeout: failover (the next target) or
	// retry (in place). Default: failover with a fallback, else retry.
	OnTimeout string `yaml:"on_timeout"`
	// AttemptsOnClientRetry caps attempts per target when the client is
	// retrying on its own (X-Stainless-Retry-Count > 0). Default 1.
	AttemptsOnClientRetry int `yaml:"attempts_on_client_retry"`
}

// Policy compiles the retry policy, its defaults filled for a route of
// fallbacks fallbacks; an error names what is wrong with on or on_timeout.
func (r Retry) Policy(fallbacks int) (policy.Retry, error) {
	on, err := policy.ParseRetryOn(r.On)
	if err != nil {
		return policy.Retry{}, err
	}
	ot, err := policy.ParseOnTimeout(r.OnTimeout)
	if err != nil {
		return policy.Retry{}, fmt.Errorf("on_timeout %w", err)
	}
	return policy.Retry{MaxAttempts: r.MaxAttempts, Backoff: policy.Backoff{Base: r.BaseDelay, Max: r.MaxDelay},
		MaxRetryAfter: r.MaxRetryAfter, On: on, ReplayWrites: r.ReplayWrites, MaxTotalAttempts: r.MaxTotalAttempts,
		OnTimeout: ot}.WithDefaults(fallbacks), nil
}

func (r Route) withDefaults() Route {
	upstream.OrDefault(&r.PathPrefix, "/")
	upstream.OrDefault(&r.Retry.AttemptsOnClientRetry, DefaultClientRetries)
	upstream.OrDefault(&r.Deadline, DefaultDeadline)
	upstream.OrDefault(&r.MaxBody, DefaultMaxBody)
	if r.StreamHold != (StreamHold{}) {
		upstream.OrDefault(&r.StreamHold.Max, DefaultStreamHoldMax)
		upstream.OrDefault(&r.StreamHold.Bytes, DefaultStreamHoldBytes)
	}
	upstream.OrDefault(&r.MaxRescueBytes, DefaultMaxRescueBytes)
	if r.MaxRescues == nil {
		r.MaxRescues = new(DefaultMaxRescues)
	}
	return r
}

// Options configures a Proxy.
type Options struct {
	// SharedState, when set, shares cooldowns, limits and breaker hints
	// with the fleet's other replicas through Redis.
	SharedState *SharedState
	// Tracing, when set, traces every request with OpenTelemetry.
	Tracing *Tracing
	// Upstreams are the model servers (package upstream); routes name them.
	Upstreams []upstream.Options
	Routes    []Route
	// Clients are per-client rate limits every request must pass.
	Clients []ClientLimit
	// ClientKeys are settings of single client keys (client_keys_file),
	// at most MaxClientKeys.
	ClientKeys []ClientKey
	// Prices are what models cost, by model glob (the model as sent; the
	// most literal matching glob): a reply's usage priced for a spend
	// budget and sturdy_spend_usd_total.
	Prices map[string]Price
	// AuthKeys, when set, are the keys clients must present as
	// "Authorization: Bearer <key>" or "x-api-key: <key>" (credential);
	// the client's Authorization and x-api-key are then never forwarded
	// upstream.
	AuthKeys []string
	// Server bounds the client-facing listener (fixed at New).
	Server ServerLimits
	// TrustedProxies are the peers (say, a load balancer) whose
	// X-Forwarded-For, -Host and -Proto are kept, Sturdy appending its
	// peer; from any other peer they are replaced by what Sturdy saw.
	// Empty: nobody is trusted.
	TrustedProxies []netip.Prefix
	// AllowedHosts are names, beyond localhost and *.localhost, a request
	// on a loopback address may carry as its Host or Origin
	// (policy.LocalHost, LocalOrigin). Lower case.
	AllowedHosts []string
	// CORSOrigins are the browser origins granted cross-origin calls
	// (policy.CORSAllowed): their preflights are answered, their answers
	// marked. Empty: none; every preflight is refused.
	CORSOrigins []string
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
