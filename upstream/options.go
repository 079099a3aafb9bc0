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
	Name string `yaml:"name"`
	// URL is scheme://host[:port][/prefix]; the request URI is appended.
	// A pool of one: set URL, Endpoints or Discover.
	URL string `yaml:"url"`
	// Endpoints are the replicas of a pool, each in URL's form.
	Endpoints []string `yaml:"endpoints"`
	// Discover finds the pool's endpoints in DNS instead.
	Discover Discover `yaml:"discover"`
	// Balance picks an endpoint for each attempt. Default least_requests.
	Balance Balance `yaml:"balance"`
	// Affinity keys requests for Balance affinity.
	Affinity Affinity `yaml:"affinity"`
	// HealthCheck probes each endpoint; off when Path is empty.
	HealthCheck HealthCheck `yaml:"health_check"`
	// SlowStart ramps a returning endpoint's share up over this long; 0:
	// no ramp. nil: the default, 30 s.
	SlowStart *time.Duration `yaml:"slow_start"`
	// MaxEjected is the share of the pool its breakers may take out at
	// once (always at least one endpoint). Default 0.5.
	MaxEjected units.Percent `yaml:"max_ejected"`
	// RideThrough, when set, makes a request wait this long (within its
	// deadline) for an endpoint to come back when every one is out,
	// instead of failing at once; 0: off.
	RideThrough time.Duration `yaml:"ride_through"`
	// Continuation says how the upstream continues a partial assistant
	// message, for rescuing a stream cut mid-answer (ContinueNone: it is
	// never asked to).
	Continuation Continuation `yaml:"continuation"`
	// APIKey, when set, replaces the client's credential: sent as
	// "Authorization: Bearer <key>", and on the Messages API's paths as
	// x-api-key unless APIKeyHeader is authorization (vLLM's /v1/messages
	// takes only Bearer; see Bearer). APIKeyFile is where the config
	// read it from, if it did.
	APIKey       string `yaml:"api_key"`
	APIKeyHeader string `yaml:"api_key_header"`
	APIKeyFile   string `yaml:"api_key_file"`
	// APIs are the APIs the upstream serves (zero: both); a request
	// speaking another skips it.
	APIs APIs `yaml:"apis"`
	// TLS configures verification of an https upstream.
	TLS TLS `yaml:"tls"`
	// Timeouts bound each attempt.
	Timeouts Timeouts `yaml:"timeouts"`
	// MaxConnections caps open connections (one per in-flight request).
	// Default 512.
	MaxConnections int `yaml:"max_connections"`
	// Breaker configures the upstream's circuit breaker; its zero fields
	// take breaker's defaults.
	Breaker breaker.Settings `yaml:"breaker"`
	// RateLimit paces requests to the upstream; zero RequestsPerSecond
	// means no pacing.
	RateLimit RateLimit `yaml:"rate_limit"`
	// MaxInFlight caps concurrent requests (streams included); 0 means
	// unlimited.
	MaxInFlight int `yaml:"max_in_flight"`
	// QueueTimeout is how long a request waits for a slot under
	// MaxInFlight, a connection place, or a place under the endpoint's
	// concurrency limit (it is Concurrency.Queue.Timeout: either key sets
	// both). Default 5 s.
	QueueTimeout time.Duration `yaml:"queue_timeout"`
	// Concurrency limits the requests in flight on each endpoint, fixed
	// or adaptive, with a bounded queue in front; off by default.
	Concurrency Concurrency `yaml:"concurrency"`
	// RetryBudget caps retries to the upstream.
	RetryBudget RetryBudget `yaml:"retry_budget"`
	// Cooldown says how the upstream's 429s are learned.
	Cooldown Cooldown `yaml:"cooldown"`
	// TokensPerMinute paces the upstream under its provider's tokens a
	// minute, per model glob (the model as sent): a request reserves its
	// estimate when the target is chosen and settles to its reply's usage;
	// one the window cannot take waits up to rate_limit.max_wait (default
	// 2 s; at most three such waits), then fails over or is refused 429. Unset: none. At most
	// MaxTokenModels globs.
	TokensPerMinute map[string]int64 `yaml:"tokens_per_minute"`
	// StreamUsage, when false, stops Sturdy from asking the upstream for
	// a stream's usage (stream_options.include_usage on a chat or legacy
	// completions stream a token budget counts) for a server that refuses
	// the field. Default true.
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
	// Connect bounds dialling and the TLS handshake. Default 2 s.
	Connect time.Duration `yaml:"connect"`
	// FirstByte runs from sending the request to the first body byte
	// (the end of the head for a bodyless reply). Default 60 s.
	FirstByte time.Duration `yaml:"first_byte"`
	// Idle bounds each gap between reads of a streamed body. Default 30 s.
	Idle time.Duration `yaml:"idle"`
}

// TLS configures verification of an https upstream: CAFile adds PEM CAs
// to trust (an internal gateway's), InsecureSkipVerify turns verification
// off (tests against self-signed servers only).
type TLS struct {
	CAFile             string `yaml:"ca_file"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
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
	// RequestsPerSecond is the sustained rate; 0 means no pacing.
	RequestsPerSecond float64 `yaml:"requests_per_second"`
	// Burst is how many requests may go at once. Default: the rate
	// rounded up, at least 1.
	Burst int `yaml:"burst"`
	// MaxWait is the longest a request waits for its turn. Default 2 s.
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
	Header string `yaml:"header"`
	Prefix int    `yaml:"prefix"`
}

// HealthCheck probes every endpoint with a GET of Path: Unhealthy
// failures in a row take it out, Healthy successes bring it back.
// Defaults: every 5 s, timeout 1 s, healthy 2, unhealthy 3.
type HealthCheck struct {
	Path      string        `yaml:"path"`
	Every     time.Duration `yaml:"every"`
	Timeout   time.Duration `yaml:"timeout"`
	Healthy   int           `yaml:"healthy"`
	Unhealthy int           `yaml:"unhealthy"`
}

// Discover resolves DNS every Every (default 10 s) for the pool's
// endpoints: DNS is host:port, Scheme http (default) or https (verified
// against the DNS name, never the resolved address).
type Discover struct {
	DNS    string        `yaml:"dns"`
	Scheme string        `yaml:"scheme"`
	Every  time.Duration `yaml:"every"`
}

// Cooldown configures what an upstream's rate limits teach Sturdy: a 429
// with Retry-After, x-ratelimit-remaining-*: 0, or a 429 without a wait
// puts the (credential, model) in cooldown, so other requests do not
// rediscover it.
type Cooldown struct {
	// Enabled false learns nothing: for servers whose 429s are per
	// request, not per quota. Default (nil): on.
	Enabled *bool `yaml:"enabled"`
	// WithoutHeader is the first cooldown of a 429 that gives no wait; it
	// doubles for each such 429 in a row (up to 60 s) and a success ends
	// the run. Default 1 s.
	WithoutHeader time.Duration `yaml:"without_header"`
	// Max caps every cooldown learned (from any header: Retry-After,
	// x-ratelimit-reset-*) or adopted from the fleet, so one reply
	// cannot lock a credential out for long. Default 10 minutes.
	Max time.Duration `yaml:"max"`
}

// On says cooldowns are learned (enabled is not false).
func (c Cooldown) On() bool { return c.Enabled == nil || *c.Enabled }

// RetryBudget caps retries: within 10 s they may add Ratio of the first
// attempts plus MinPerSecond per second. Defaults 0.5 and 10.
type RetryBudget struct {
	Ratio        float64 `yaml:"ratio"`
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
