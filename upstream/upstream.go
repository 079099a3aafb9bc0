package upstream

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"sturdy/breaker"
	"sturdy/policy"
)

// Upstream is one model server: a pool of endpoints (replicas; one for a
// plain url) and the traffic policy they share.
type Upstream struct {
	name string
	opts Options // as configured, to tell a changed definition on reload
	env  *Env
	auth []byte // "Bearer <api_key>", or nil to pass the client's
	// msgAuth is the header api_key goes in on the Messages API's paths,
	// and its value: x-api-key, or Authorization (api_key_header).
	msgAuth, msgAuthValue []byte
	// inFlight counts requests using this upstream, streams included.
	inFlight atomic.Int64

	// Traffic policy: pacing (nil: none), concurrency slots (nil:
	// unlimited), retry budget, cooldowns learned from 429s.
	limiter   *rate.Limiter
	maxWait   time.Duration
	tokens    []ModelTokens // tokens_per_minute, most literal glob first
	slots     Slots
	budget    *policy.Budget
	cooldowns Cooldowns
	// bareCooldown is the first cooldown of a 429 without a wait; 0 when
	// cooldowns are off.
	bareCooldown time.Duration

	// pool holds the endpoints taking requests now; DNS discovery swaps
	// it. drained are those DNS dropped, kept until their requests end.
	pool      atomic.Pointer[[]*Endpoint]
	drainedMu sync.Mutex
	drained   []*Endpoint
	// prev is the upstream this one replaces in a reload, until own.
	prev      *Upstream
	balance   Balance
	turn      atomic.Uint64 // round robin
	slowStart time.Duration
	// maxEjected is the share of the pool breakers may eject at once;
	// ejectMu makes the count and the ejection one step (mayEject).
	maxEjected float64
	ejectMu    sync.Mutex
	// riders bounds the requests riding through an outage (ride_through)
	// when max_in_flight does not (nil otherwise).
	riders Slots
	// changed is closed (and replaced) when an endpoint's state changes,
	// waking requests that ride through an outage.
	changedMu sync.Mutex
	changed   chan struct{}
	// selfWarned says discovery warned of an address that is Sturdy's
	// own listener (once per upstream).
	selfWarned atomic.Bool
	// quit ends the background loop (health checks, DNS discovery).
	quit      chan struct{}
	startOnce sync.Once
	quitOnce  sync.Once
}

// New builds an upstream from o, its defaults filled. The
// endpoints of prev (the upstream of that name before a reload) whose
// definition is unchanged are kept, with their connections, breakers and
// health.
func New(env *Env, o Options, prev *Upstream) (*Upstream, error) {
	up := &Upstream{
		name:       o.Name,
		opts:       o,
		env:        env,
		prev:       prev,
		budget:     &policy.Budget{Ratio: o.RetryBudget.Ratio, MinPerSecond: o.RetryBudget.MinPerSecond},
		balance:    o.Balance,
		slowStart:  max(*o.SlowStart, 0),
		maxEjected: float64(o.MaxEjected),
		changed:    make(chan struct{}),
		quit:       make(chan struct{}),
	}
	if o.APIKey != "" {
		up.auth = []byte("Bearer " + o.APIKey)
		up.msgAuth, up.msgAuthValue = []byte("x-api-key"), []byte(o.APIKey)
		if o.Bearer() {
			up.msgAuth, up.msgAuthValue = []byte("Authorization"), up.auth
		}
	}
	if o.RateLimit.RequestsPerSecond > 0 {
		up.limiter = rate.NewLimiter(rate.Limit(o.RateLimit.RequestsPerSecond), o.RateLimit.Burst)
		up.maxWait = o.RateLimit.MaxWait
	}
	up.tokens = buildTokens(o, prev)
	if o.MaxInFlight > 0 {
		up.slots = make(Slots, o.MaxInFlight)
	} else if o.RideThrough > 0 {
		up.riders = make(Slots, DefaultRideThroughQueue)
	}
	if o.Cooldown.On() {
		up.bareCooldown = o.Cooldown.WithoutHeader
	}
	up.cooldowns.max, up.cooldowns.onEvict = o.Cooldown.Max, env.Evicted("cooldowns")
	var kept []*Endpoint
	if prev != nil {
		kept = *prev.pool.Load()
	}
	urls := up.urls(prev, kept)
	pool, err := up.endpoints(urls, kept, false)
	if err != nil {
		return nil, err
	}
	up.pool.Store(&pool)
	return up, nil
}

// urls returns the endpoint URLs the pool starts with: the url, the
// endpoints, or what DNS has — on a reload with the same discover, the
// last good set (kept), which the background loop refreshes.
func (up *Upstream) urls(prev *Upstream, kept []*Endpoint) []string {
	o := up.opts
	switch {
	case o.Discover.DNS != "" && prev != nil && prev.opts.Discover.DNS == o.Discover.DNS &&
		prev.opts.Discover.Scheme == o.Discover.Scheme:
		urls := make([]string, 0, len(kept))
		for _, ep := range kept {
			urls = append(urls, ep.spec.url)
		}
		return urls
	case o.Discover.DNS != "":
		found, err := up.resolve()
		if err != nil {
			up.env.Log.Warn().Str("upstream", o.Name).Str("dns", o.Discover.DNS).Str("error", err.Error()).
				Msg("discovery failed: the pool starts empty, retrying")
		}
		return found
	case len(o.Endpoints) > 0:
		return o.Endpoints
	}
	return []string{o.URL}
}

// endpoints builds the pool for urls, reusing endpoints of kept with the
// same definition; fresh ones start their slow start when ramp is set
// (an endpoint that appears in a running pool).
func (up *Upstream) endpoints(urls []string, kept []*Endpoint, ramp bool) ([]*Endpoint, error) {
	pool := make([]*Endpoint, 0, len(urls))
	for _, u := range urls {
		spec := up.spec(u)
		var ep *Endpoint
		for _, k := range kept {
			if reflect.DeepEqual(k.spec, spec) {
				ep = k
				break
			}
		}
		if ep == nil {
			var err error
			if ep, err = newEndpoint(up.env, up.name, spec, up.env.breakerChanged, up.env.modelBreakerChanged,
				up.env.Evicted("model_breakers")); err != nil {
				return nil, err
			}
			if ramp {
				ep.CameBack(time.Now())
			}
			ep.owner.Store(up) // a kept one changes hands once the table is live (own)
		}
		pool = append(pool, ep)
	}
	return pool, nil
}

// spec is the definition of the endpoint at url.
func (up *Upstream) spec(url string) endpointSpec {
	o := up.opts
	s := endpointSpec{url: url, connect: o.Timeouts.Connect, firstByte: o.Timeouts.FirstByte, idle: o.Timeouts.Idle,
		maxConns: o.MaxConnections, queue: o.QueueTimeout, concurrency: o.Concurrency, breaker: o.Breaker, caFile: o.TLS.CAFile,
		insecure: o.TLS.InsecureSkipVerify}
	s.breaker.OnStateChange = nil
	if o.Discover.DNS != "" {
		s.hostName = o.Discover.DNS // verified by TLS and sent as Host, never the address
	}
	return s
}

// Own makes up the owner of its endpoints, once its table is live: their
// breaker and health changes wake up's riders and count against its
// max_ejected. Endpoints a reload kept from an upstream whose health
// check changed (or went) are judged afresh, and those the previous
// upstream was draining are drained on here.
func (up *Upstream) Own() {
	for _, ep := range up.Endpoints() {
		prev := ep.owner.Swap(up)
		if prev != nil && prev != up && prev.opts.HealthCheck != up.opts.HealthCheck {
			ep.resetHealth()
		}
	}
	if up.prev != nil {
		d := up.prev.draining()
		up.drainedMu.Lock()
		up.drained = append(up.drained, d...)
		up.drainedMu.Unlock()
		up.prev = nil
	}
}

// Endpoints returns the endpoints taking requests.
func (up *Upstream) Endpoints() []*Endpoint { return *up.pool.Load() }

// mayEject reports whether ep's connection breaker may open: the pool
// has fewer than max_ejected of its endpoints ejected (at least one may
// always be). It runs under ep's breaker lock and only reads atomics.
func (up *Upstream) mayEject(ep *Endpoint) bool {
	up.ejectMu.Lock()
	defer up.ejectMu.Unlock()
	pool := up.Endpoints()
	allowed := max(1, int(up.maxEjected*float64(len(pool))))
	n := 0
	for _, o := range pool {
		if o != ep && o.ejected.Load() {
			n++
		}
	}
	if n >= allowed {
		return false
	}
	ep.ejected.Store(true)
	ep.ejections.Add(1)
	return true
}

// Notify wakes the requests waiting for an endpoint to come back.
func (up *Upstream) Notify() {
	up.changedMu.Lock()
	close(up.changed)
	up.changed = make(chan struct{})
	up.changedMu.Unlock()
}

// Changes returns a channel closed at the next change of an endpoint.
func (up *Upstream) Changes() <-chan struct{} {
	up.changedMu.Lock()
	defer up.changedMu.Unlock()
	return up.changed
}

// Start begins the upstream's background work, once: health checks and
// DNS discovery, when configured.
func (up *Upstream) Start() {
	up.startOnce.Do(func() {
		if up.opts.HealthCheck.Path != "" || up.opts.Discover.DNS != "" {
			go up.background()
		}
	})
}

// Close stops the background work and lets go of the connections of the
// endpoints no newer upstream kept.
func (up *Upstream) Close() {
	up.quitOnce.Do(func() { close(up.quit) })
	for _, ep := range up.Endpoints() {
		if ep.owner.Load() == up {
			ep.close()
		}
	}
}

// tlsConfig verifies an https endpoint by serverName, trusting the
// system's CAs and caFile's.
func tlsConfig(upstream, caFile string, insecure bool, serverName string) (*tls.Config, error) {
	c := &tls.Config{ServerName: serverName, MinVersion: tls.VersionTLS12, InsecureSkipVerify: insecure} // #nosec G402 -- opt-in, documented as test-only
	if caFile == "" {
		return c, nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	pem, err := os.ReadFile(caFile)
	if err != nil || !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("upstream %q: cannot read PEM certificates from ca_file %q", upstream, caFile)
	}
	c.RootCAs = pool
	return c, nil
}

// Name is the upstream's name (routes, logs, metrics, error bodies).
func (up *Upstream) Name() string { return up.name }

// Options returns the upstream's options as built (defaults filled);
// read only.
func (up *Upstream) Options() *Options { return &up.opts }

// Auth is the Authorization value Sturdy sends ("Bearer <api_key>"), or
// nil to pass the client's. It must never reach a log or an error.
func (up *Upstream) Auth() []byte { return up.auth }

// MessagesAuth is the header and value Sturdy sends api_key in on the
// Messages API's paths (x-api-key, or Authorization: Bearer with
// api_key_header: authorization); nil when the upstream has no api_key.
// Never to be logged.
func (up *Upstream) MessagesAuth() (name, value []byte) { return up.msgAuth, up.msgAuthValue }

// Budget is the upstream's retry budget.
func (up *Upstream) Budget() *policy.Budget { return up.budget }

// Cooldowns are the upstream's cooldowns learned from 429s.
func (up *Upstream) Cooldowns() *Cooldowns { return &up.cooldowns }

// BareCooldown is the first cooldown of a 429 without a wait; 0 when
// cooldowns are off.
func (up *Upstream) BareCooldown() time.Duration { return up.bareCooldown }

// Pacing is the upstream's rate limiter (nil: no pacing) and the longest
// a request waits for its turn.
func (up *Upstream) Pacing() (*rate.Limiter, time.Duration) { return up.limiter, up.maxWait }

// SlowStart is how long a returning endpoint's share ramps up (0: no
// ramp).
func (up *Upstream) SlowStart() time.Duration { return up.slowStart }

// Enter counts a request in the upstream's in-flight requests; Leave
// counts it out.
func (up *Upstream) Enter() { up.inFlight.Add(1) }

// Leave counts a request out of the upstream's in-flight requests.
func (up *Upstream) Leave() { up.inFlight.Add(-1) }

// Limited reports whether the upstream has max_in_flight slots.
func (up *Upstream) Limited() bool { return up.slots != nil }

// TakeSlot takes a max_in_flight slot, waiting as r allows (see
// Slots.Acquire); a taken slot is given back with FreeSlot.
func (up *Upstream) TakeSlot(r LeaseRequest) LeaseResult { return up.slots.Acquire(r) }

// FreeSlot gives a max_in_flight slot back.
func (up *Upstream) FreeSlot() { up.slots.Release() }

// TakeRider takes a place among the requests riding through an outage,
// when max_in_flight does not bound them; false: their queue is full.
// held says a place was taken (to give back with FreeRider).
func (up *Upstream) TakeRider() (ok, held bool) {
	if up.riders == nil {
		return true, false
	}
	select {
	case up.riders <- struct{}{}:
		return true, true
	default:
		return false, false
	}
}

// RidersFull reports whether the riders' queue is full.
func (up *Upstream) RidersFull() bool { return up.riders != nil && len(up.riders) == cap(up.riders) }

// FreeRider gives a riders' place back.
func (up *Upstream) FreeRider() { up.riders.Release() }

// Hint takes the endpoint at addr out of this replica's picks until
// until: another replica's breaker has it out (share_breakers).
func (up *Upstream) Hint(addr string, until time.Time) {
	for _, ep := range up.Endpoints() {
		if ep.addr == addr {
			ep.hintedUntil.Store(until.UnixNano())
			up.Notify()
		}
	}
}

// modelBreakerChanged logs a model's reply breaker transition on an
// endpoint and exports it.
func (env *Env) modelBreakerChanged(ep *Endpoint, model string, from, to breaker.State) {
	up := ep.owner.Load()
	ev := env.Log.Warn()
	if to == breaker.StateClosed {
		ev = env.Log.Info()
	}
	ev.Str("upstream", up.name).Str("endpoint", ep.addr).Str("model", model).Str("from", from.String()).
		Str("to", to.String()).Msg("model breaker state change")
	env.Metrics.ModelBreakerTransitions.WithLabelValues(up.name, ep.addr, env.ModelLabel(model), to.String()).Inc()
	up.Notify()
}

// breakerChanged logs an endpoint's connection breaker transition (an
// ejection, a probe, a return) and exports it. A return starts the
// endpoint's slow start and wakes requests riding through.
func (env *Env) breakerChanged(ep *Endpoint, from, to breaker.State) {
	up := ep.owner.Load()
	ev := env.Log.Warn()
	switch to {
	case breaker.StateClosed:
		ev = env.Log.Info()
		ep.ejected.Store(false)
		ep.CameBack(time.Now())
	case breaker.StateOpen:
		if from == breaker.StateClosed {
			ev = ev.Str("reason", "ejected")
		}
		if announce := env.Announcer(); announce != nil {
			// Not here: the breaker calls this with its lock held.
			go func() { announce(up.name, ep.addr, time.Now().Add(ep.breaker.ProbeIn(time.Now()))) }()
		}
	}
	ev.Str("upstream", up.name).Str("endpoint", ep.addr).Str("from", from.String()).Str("to", to.String()).
		Msg("breaker state change")
	env.Metrics.BreakerState.WithLabelValues(up.name, ep.addr).Set(float64(to))
	env.Metrics.BreakerTransitions.WithLabelValues(up.name, ep.addr, to.String()).Inc()
	up.Notify()
}

// Forget deletes the metric series of an endpoint gone from upstream.
func (env *Env) Forget(upstream string, ep *Endpoint) {
	labels := prometheus.Labels{"upstream": upstream, "endpoint": ep.addr}
	m := env.Metrics
	for _, v := range []interface {
		DeletePartialMatch(prometheus.Labels) int
	}{m.BreakerState, m.BreakerTransitions, m.ModelBreakerTransitions, m.ModelBreakerState, m.EndpointInFlight,
		m.EndpointUp, m.Attempts, m.ConcurrencyLimit, m.ConcurrencyQueued} {
		v.DeletePartialMatch(labels)
	}
}

// CloseIdleConnections closes the pooled connections of the upstream's
// endpoints.
func (up *Upstream) CloseIdleConnections() {
	for _, ep := range up.Endpoints() {
		ep.close()
	}
}

// Tokens is the tokens_per_minute window the model (as sent) is paced
// by, and its glob; nil when none matches.
func (up *Upstream) Tokens(model string) *ModelTokens {
	for i := range up.tokens {
		if policy.GlobMatch(up.tokens[i].Glob, model) {
			return &up.tokens[i]
		}
	}
	return nil
}

// TokenWait is the longest a request waits for the upstream's
// tokens_per_minute: rate_limit.max_wait, else DefaultPacingMaxWait.
func (up *Upstream) TokenWait() time.Duration {
	if w := up.opts.RateLimit.MaxWait; w > 0 {
		return w
	}
	return DefaultPacingMaxWait
}

// HasTokenLimits reports whether the upstream sets tokens_per_minute.
func (up *Upstream) HasTokenLimits() bool { return len(up.tokens) > 0 }
