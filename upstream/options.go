package upstream

import (
	"context"
	"net"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"go.yaml.in/yaml/v3"

	"sturdy/breaker"
	"sturdy/metrics"
	"sturdy/policy"
	"sturdy/units"
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
	DefaultBareCooldown     = time.Second
	DefaultCooldownMax      = 10 * time.Minute
	DefaultSlowStart        = 30 * time.Second
	DefaultMaxEjected       = 0.5
	DefaultHealthEvery      = 5 * time.Second
	DefaultHealthTimeout    = time.Second
	DefaultHealthy          = 2
	DefaultUnhealthy        = 3
	DefaultDiscoverEvery    = 10 * time.Second
	// DefaultRideThroughQueue bounds the requests riding through an
	// outage when max_in_flight is unlimited.
	DefaultRideThroughQueue = 1024
)

// Options configure one upstream: a model server, or a pool of its
// replicas. It is the one shape of an upstream: the config file's
// upstreams[] entries decode into it (the yaml keys below; package config
// validates it, with key and line), and New compiles it.
type Options struct {
	// Name identifies the upstream in routes, logs and error bodies.
	// Required.
	Name string `yaml:"name"`
	// URL is the server's address, scheme://host[:port][/prefix] with
	// http or https; the request path is appended, a trailing slash
	// ignored. Set exactly one of url, endpoints and discover. ${VAR} is
	// expanded. Default none.
	URL string `yaml:"url"`
	// Endpoints are a pool's replicas, each in url's form
	// (docs/pools.md). ${VAR} is expanded. Default none.
	Endpoints []string `yaml:"endpoints"`
	// Discover finds a pool's endpoints in DNS: one per address the name
	// resolves to. A failed resolution keeps the last good set; vanished
	// addresses are drained. Default none.
	Discover Discover `yaml:"discover"`
	// Balance is how a pool picks an endpoint for each attempt:
	// least_requests, round_robin or affinity. Default least_requests.
	Balance Balance `yaml:"balance"`
	// Affinity is what keys a request with balance affinity: a header's
	// value, or a prefix of its messages. Bounded load: no endpoint above
	// 1.25 times the mean in flight. Default none.
	Affinity Affinity `yaml:"affinity"`
	// HealthCheck probes each endpoint with a GET of its path. Default
	// off.
	HealthCheck HealthCheck `yaml:"health_check"`
	// SlowStart is how long a returning or new endpoint's share takes to
	// ramp up; 0s: at once. Default 30s.
	SlowStart *time.Duration `yaml:"slow_start"`
	// MaxEjected is the share of the pool its breakers may eject at once
	// ("50%" or 0.5); one endpoint always may be. Health checks are not
	// bounded by it. Default 50%.
	MaxEjected units.Percent `yaml:"max_ejected"`
	// RideThrough is how long a request waits, within its deadline, for
	// an endpoint to come back when every one is out, instead of failing
	// at once. Waiting requests hold max_in_flight slots; with it
	// unlimited, at most 1024 wait. 0s: off. Default 0s.
	RideThrough time.Duration `yaml:"ride_through"`
	// Continuation is how the upstream continues a partial answer, for
	// rescuing a stream cut mid-answer: vllm (continue_final_message),
	// prefill (a trailing assistant message) or none (never sent a
	// partial answer). On /v1/messages only prefill continues. Default
	// none.
	Continuation Continuation `yaml:"continuation"`
	// APIKey, when set, replaces the client's credential: sent as
	// "Authorization: Bearer <key>", and on the Messages API's paths as
	// x-api-key unless api_key_header is authorization. ${VAR} is
	// expanded. Empty, the client's own credential goes upstream, except
	// with auth.keys on: then none does. Default none.
	APIKey string `yaml:"api_key"`
	// APIKeyHeader is how api_key goes on the Messages API's paths:
	// x-api-key, or authorization (Bearer, as vLLM's /v1/messages takes
	// it). Default x-api-key.
	APIKeyHeader string `yaml:"api_key_header"`
	// APIKeyFile names a file holding api_key, in place of it (not
	// both). Default none.
	APIKeyFile string `yaml:"api_key_file"`
	// APIs are the request formats the upstream serves, openai and
	// anthropic, with no translation between them; a request speaking
	// another passes it over. Default `[openai, anthropic]`.
	APIs APIs `yaml:"apis"`
	// TLS is how an https upstream is verified: verification is on
	// unless turned off here.
	TLS TLS `yaml:"tls"`
	// Timeouts are the bounds of each attempt.
	Timeouts Timeouts `yaml:"timeouts"`
	// MaxConnections caps open connections to each endpoint; each
	// request or stream in flight holds one. Default 512.
	MaxConnections int `yaml:"max_connections"`
	// Breaker is each endpoint's circuit breakers: one for connections,
	// one per model for replies. Its keys left out take breaker's
	// defaults.
	Breaker breaker.Settings `yaml:"breaker"`
	// RateLimit paces requests to the upstream below a provider's
	// quota. Default off.
	RateLimit RateLimit `yaml:"rate_limit"`
	// MaxInFlight caps concurrent requests to the upstream, streams
	// included; 0: unlimited. Default 0.
	MaxInFlight int `yaml:"max_in_flight"`
	// QueueTimeout is how long a request waits, in all, for a slot
	// under max_in_flight, a connection and a place under the endpoint's
	// concurrency limit; then 503 upstream_busy, or a fallback. It is
	// concurrency.queue.timeout: either key sets both. Default 5s.
	QueueTimeout time.Duration `yaml:"queue_timeout"`
	// Concurrency limits the requests in flight on each endpoint, fixed
	// or adaptive, with a bounded queue in front (docs/overload.md).
	// Default off.
	Concurrency Concurrency `yaml:"concurrency"`
	// RetryBudget caps retries to the upstream: within 10 s they may add
	// ratio of the first attempts plus min_per_second a second.
	RetryBudget RetryBudget `yaml:"retry_budget"`
	// Cooldown is what the upstream's 429s and x-ratelimit-* headers
	// teach: a cooldown per credential and model, so other requests do
	// not rediscover it.
	Cooldown Cooldown `yaml:"cooldown"`
	// TokensPerMinute paces the upstream under its provider's tokens a
	// minute, per model glob (the model as sent; at most 64 globs).
	// A request reserves its estimate when the target is chosen and
	// settles to its reply's usage. One the window cannot take waits up
	// to rate_limit.max_wait (at most three such waits), then fails over
	// or gets 429. Default none.
	TokensPerMinute map[string]int64 `yaml:"tokens_per_minute"`
	// StreamUsage lets Sturdy set stream_options.include_usage on a chat
	// or legacy completions stream a token budget counts; false for a
	// server that refuses the field. Default true.
	StreamUsage *bool `yaml:"stream_usage"`
}

// MaxTokenModels bounds the model globs of an upstream's
// tokens_per_minute.
const MaxTokenModels = 64

// AsksStreamUsage reports whether Sturdy may set
// stream_options.include_usage on a stream to the upstream (StreamUsage).
func (u *Options) AsksStreamUsage() bool { return u.StreamUsage == nil || *u.StreamUsage }

// Timeouts bound each attempt to an upstream.
type Timeouts struct {
	// Connect bounds dialling and the TLS handshake. Default 2s.
	Connect time.Duration `yaml:"connect"`
	// FirstByte bounds the wait from sending the request to the first
	// body byte: the end of the head for a bodyless reply, a stream's
	// first output. Default 60s.
	FirstByte time.Duration `yaml:"first_byte"`
	// Idle bounds each gap between reads of a streamed body. Default 30s.
	Idle time.Duration `yaml:"idle"`
}

// TLS configures verification of an https upstream.
type TLS struct {
	// CAFile names a PEM file of extra CAs to trust (an internal
	// gateway's). Default none.
	CAFile string `yaml:"ca_file"`
	// InsecureSkipVerify turns verification off: for tests against
	// self-signed servers only. Default false.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// Bearer says api_key goes as Authorization: Bearer on the Messages API's
// paths too (api_key_header: authorization), not as x-api-key.
func (u Options) Bearer() bool { return strings.EqualFold(u.APIKeyHeader, "authorization") }

// WithDefaults returns u with its zero fields set to their defaults.
func (u Options) WithDefaults() Options {
	OrDefault(&u.Timeouts.Connect, DefaultConnectTimeout)
	OrDefault(&u.Timeouts.FirstByte, DefaultFirstByteTimeout)
	OrDefault(&u.Timeouts.Idle, DefaultIdleTimeout)
	OrDefault(&u.MaxConnections, DefaultMaxConnections)
	OrDefault(&u.QueueTimeout, u.Concurrency.Queue.Timeout) // one setting, two keys
	OrDefault(&u.QueueTimeout, DefaultQueueTimeout)
	u.Concurrency = u.Concurrency.withDefaults(u.QueueTimeout)
	if u.RateLimit.RequestsPerSecond > 0 {
		OrDefault(&u.RateLimit.MaxWait, DefaultPacingMaxWait)
		OrDefault(&u.RateLimit.Burst, BurstFor(u.RateLimit.RequestsPerSecond))
	}
	OrDefault(&u.RetryBudget.Ratio, DefaultBudgetRatio)
	OrDefault(&u.RetryBudget.MinPerSecond, DefaultBudgetPerSecond)
	OrDefault(&u.Cooldown.WithoutHeader, DefaultBareCooldown)
	OrDefault(&u.Cooldown.Max, DefaultCooldownMax)
	if u.SlowStart == nil {
		u.SlowStart = new(DefaultSlowStart)
	}
	OrDefault(&u.MaxEjected, DefaultMaxEjected)
	if u.HealthCheck.Path != "" {
		OrDefault(&u.HealthCheck.Every, DefaultHealthEvery)
		OrDefault(&u.HealthCheck.Timeout, DefaultHealthTimeout)
		OrDefault(&u.HealthCheck.Healthy, DefaultHealthy)
		OrDefault(&u.HealthCheck.Unhealthy, DefaultUnhealthy)
	}
	if u.Discover.DNS != "" {
		OrDefault(&u.Discover.Every, DefaultDiscoverEvery)
		OrDefault(&u.Discover.Scheme, "http")
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

// Continues says whether an upstream continuing as c continues a stream
// of api: vllm's flags are chat completions' (vLLM's /v1/messages takes
// neither continue_final_message nor add_generation_prompt: it would
// answer a prefill as a new turn), prefill works on both.
func (c Continuation) Continues(api policy.API) bool {
	switch c {
	case ContinuePrefill:
		return true
	case ContinueVLLM:
		return api != policy.APIAnthropic
	}
	return false
}

// continuations are the values of continuation: in a config file.
var continuations = map[string]Continuation{"": ContinueNone, "none": ContinueNone, "vllm": ContinueVLLM, "prefill": ContinuePrefill}

// UnmarshalYAML reads continuation: vllm, prefill or none.
func (c *Continuation) UnmarshalYAML(n *yaml.Node) (err error) {
	*c, err = units.Enum(n, continuations, "vllm, prefill or none")
	return err
}

// APIs is a set of the request formats an upstream serves: OpenAI's
// (and every path that is not Anthropic's) and Anthropic's Messages API.
// No translation between them: a request keeps its API.
type APIs uint8

// The APIs an upstream may serve.
const (
	ServesOpenAI APIs = 1 << iota
	ServesAnthropic
)

// UnmarshalYAML reads apis: a list of openai and anthropic.
func (a *APIs) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.SequenceNode || len(n.Content) == 0 {
		return units.TypeError(n, "list openai and/or anthropic (leave it out for both)")
	}
	var set APIs
	for _, item := range n.Content {
		api, err := units.Enum(item, apiNames, "openai or anthropic")
		if err != nil {
			return err
		}
		set |= api
	}
	*a = set
	return nil
}

// apiNames are the values of apis: in a config file.
var apiNames = map[string]APIs{"openai": ServesOpenAI, "anthropic": ServesAnthropic}

// Serves says whether a request speaking api may go to an upstream
// serving a (none set: both).
func (a APIs) Serves(api policy.API) bool {
	if a == 0 {
		return true
	}
	if api == policy.APIAnthropic {
		return a&ServesAnthropic != 0
	}
	return a&ServesOpenAI != 0
}

// RateLimit paces requests below a provider's quota.
type RateLimit struct {
	// RequestsPerSecond is the sustained rate; 0: no pacing. Default 0.
	RequestsPerSecond float64 `yaml:"requests_per_second"`
	// Burst is how many requests may go at once. Default: the rate
	// rounded up, at least 1.
	Burst int `yaml:"burst"`
	// MaxWait is the longest a request waits for its turn; past it, 429
	// or a fallback. Default 2s.
	MaxWait time.Duration `yaml:"max_wait"`
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

// balances are the values of balance: in a config file.
var balances = map[string]Balance{"": BalanceLeastRequests, "least_requests": BalanceLeastRequests,
	"round_robin": BalanceRoundRobin, "affinity": BalanceAffinity}

// UnmarshalYAML reads balance: least_requests, round_robin or affinity.
func (b *Balance) UnmarshalYAML(n *yaml.Node) (err error) {
	*b, err = units.Enum(n, balances, "least_requests, round_robin or affinity")
	return err
}

// Affinity says what keys a request for BalanceAffinity: a header's
// value, or the first Prefix bytes of the messages' roles and contents
// in order (what a server's prefix cache keys on).
type Affinity struct {
	// Header names the header whose value is the key. Set header or
	// prefix. Default none.
	Header string `yaml:"header"`
	// Prefix is how many bytes of the messages' roles and contents, in
	// order, are the key: what a server's prefix cache keys on. Set
	// header or prefix. Default none.
	Prefix int `yaml:"prefix"`
}

// HealthCheck probes every endpoint with a GET of Path: Unhealthy
// failures in a row take it out, Healthy successes bring it back.
type HealthCheck struct {
	// Path is what each probe GETs, starting with /. Required.
	Path string `yaml:"path"`
	// Every is the time between an endpoint's probes. Default 5s.
	Every time.Duration `yaml:"every"`
	// Timeout bounds each probe. Default 1s.
	Timeout time.Duration `yaml:"timeout"`
	// Healthy is how many successes in a row bring an endpoint back.
	// Default 2.
	Healthy int `yaml:"healthy"`
	// Unhealthy is how many failures in a row take an endpoint out.
	// Default 3.
	Unhealthy int `yaml:"unhealthy"`
}

// Discover resolves DNS every Every for the pool's endpoints.
type Discover struct {
	// DNS is the name to resolve, as host:port. Required.
	DNS string `yaml:"dns"`
	// Scheme is the endpoints' scheme: http or https (verified against
	// the DNS name, never the resolved address). Default http.
	Scheme string `yaml:"scheme"`
	// Every is the time between resolutions. Default 10s.
	Every time.Duration `yaml:"every"`
}

// Cooldown configures what an upstream's rate limits teach Sturdy: a 429
// with Retry-After, x-ratelimit-remaining-*: 0, or a 429 without a wait
// puts the (credential, model) in cooldown, so other requests do not
// rediscover it.
type Cooldown struct {
	// Enabled says cooldowns are learned; false for servers whose 429s
	// are per request, not per quota. Default true.
	Enabled *bool `yaml:"enabled"`
	// WithoutHeader is the first cooldown of a 429 that gives no wait; it
	// doubles for each such 429 in a row (up to 60 s) and a success ends
	// the run. Default 1s.
	WithoutHeader time.Duration `yaml:"without_header"`
	// Max caps every cooldown learned (from any header: Retry-After,
	// x-ratelimit-reset-*) or adopted from the fleet, so one reply
	// cannot lock a credential out for long. Default 10m.
	Max time.Duration `yaml:"max"`
}

// On says cooldowns are learned (enabled is not false).
func (c Cooldown) On() bool { return c.Enabled == nil || *c.Enabled }

// RetryBudget caps retries: within 10 s they may add Ratio of the first
// attempts plus MinPerSecond per second.
type RetryBudget struct {
	// Ratio is the share of first attempts retries may add. Default 0.5.
	Ratio float64 `yaml:"ratio"`
	// MinPerSecond is the retries a second always allowed, whatever the
	// ratio. Default 10.
	MinPerSecond float64 `yaml:"min_per_second"`
}

// OrDefault sets *v to def when it is zero (or negative).
func OrDefault[T ~int | ~int64 | ~float64 | ~string](v *T, def T) {
	var zero T
	if *v == zero || (*v < zero) {
		*v = def
	}
}

// BurstFor is the default burst of a rate: one second's worth, at least 1.
func BurstFor(rps float64) int {
	b := int(rps)
	if float64(b) < rps {
		b++
	}
	return max(b, 1)
}

// Env is what the upstreams of one proxy share: where they log and
// measure, how discovery resolves, when Sturdy stops, and the proxy's
// hooks into the events of the upstream side. The proxy builds it once;
// every field is set.
type Env struct {
	Log     zerolog.Logger
	Metrics *metrics.Metrics
	// Lookup resolves the names of DNS discovery; IsSelf reports whether
	// an address found is Sturdy's own listener (left out of the pool).
	Lookup func(ctx context.Context, host string) ([]string, error)
	IsSelf func(addr string) bool
	// Stopping is closed when Sturdy shuts down: background work ends.
	Stopping <-chan struct{}
	// Evicted returns the callback that counts an entry of the per-key
	// map name ("cooldowns", "model_breakers") dropped for room.
	Evicted func(name string) func()
	// ModelLabel is a model as a metric label (the configuration's names
	// only, "other" for the rest).
	ModelLabel func(model string) string
	// Dial, when set, opens an endpoint's TCP connections instead of
	// net.Dialer (the benchmarks dial an in-memory listener); nil: a
	// dial within connect_timeout.
	Dial func(addr string) (net.Conn, error)
	// Announcer returns, while the fleet shares breakers, what tells the
	// other replicas that an endpoint's breaker opened until its probe;
	// nil otherwise.
	Announcer func() func(upstream, endpoint string, until time.Time)
}
