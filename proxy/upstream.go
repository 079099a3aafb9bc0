package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"sturdy/policy"
)

// upstream is one model server: a pool of endpoints (replicas; one for a
// plain url) and the traffic policy they share.
type upstream struct {
	name string
	opts Upstream // as configured, to tell a changed definition on reload
	p    *Proxy
	auth []byte // "Bearer <api_key>", or nil to pass the client's
	// firstByte and idle bound an attempt's head and a body's silences.
	firstByte time.Duration
	idle      time.Duration
	// inFlight counts requests using this upstream, streams included.
	inFlight atomic.Int64

	// Traffic policy: pacing (nil: none), concurrency slots (nil:
	// unlimited), retry budget, cooldowns learned from 429s.
	limiter      *rate.Limiter
	maxWait      time.Duration
	slots        slots
	queueTimeout time.Duration
	budget       *policy.Budget
	cooldowns    cooldowns
	// bareCooldown is the first cooldown of a 429 without a wait; 0 when
	// cooldowns are off.
	bareCooldown time.Duration

	// pool holds the endpoints taking requests now; DNS discovery swaps
	// it. drained are those DNS dropped, kept until their requests end.
	pool      atomic.Pointer[[]*endpoint]
	drainedMu sync.Mutex
	drained   []*endpoint
	// prev is the upstream this one replaces in a reload, until own.
	prev    *upstream
	balance Balance
	// affinity keys requests for BalanceAffinity.
	affinity  Affinity
	turn      atomic.Uint64 // round robin
	slowStart time.Duration
	// maxEjected is the share of the pool breakers may eject at once;
	// ejectMu makes the count and the ejection one step (mayEject).
	maxEjected float64
	ejectMu    sync.Mutex
	// rideThrough is how long a request may wait for an endpoint to come
	// back when all are out; riders bounds the requests waiting so when
	// max_in_flight does not (nil otherwise).
	rideThrough time.Duration
	riders      slots
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

// newUpstream builds an upstream from o, its defaults filled. The
// endpoints of prev (the upstream of that name before a reload) whose
// definition is unchanged are kept, with their connections, breakers and
// health.
func newUpstream(p *Proxy, o Upstream, prev *upstream) (*upstream, error) {
	up := &upstream{
		name:         o.Name,
		opts:         o,
		p:            p,
		prev:         prev,
		firstByte:    o.FirstByteTimeout,
		idle:         o.IdleTimeout,
		budget:       &policy.Budget{Ratio: o.RetryBudget.Ratio, MinPerSecond: o.RetryBudget.MinPerSecond},
		queueTimeout: o.QueueTimeout,
		balance:      o.Balance,
		affinity:     o.Affinity,
		slowStart:    max(o.SlowStart, 0),
		maxEjected:   o.MaxEjected,
		rideThrough:  o.RideThrough,
		changed:      make(chan struct{}),
		quit:         make(chan struct{}),
	}
	if o.APIKey != "" {
		up.auth = []byte("Bearer " + o.APIKey)
	}
	if o.RateLimit.RequestsPerSecond > 0 {
		up.limiter = rate.NewLimiter(rate.Limit(o.RateLimit.RequestsPerSecond), o.RateLimit.Burst)
		up.maxWait = o.RateLimit.MaxWait
	}
	if o.MaxInFlight > 0 {
		up.slots = make(slots, o.MaxInFlight)
	} else if o.RideThrough > 0 {
		up.riders = make(slots, DefaultRideThroughQueue)
	}
	if !o.Cooldown.Off {
		up.bareCooldown = o.Cooldown.WithoutHeader
	}
	up.cooldowns.max, up.cooldowns.onEvict = o.Cooldown.Max, p.evicted(mapCooldowns)
	var kept []*endpoint
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
func (up *upstream) urls(prev *upstream, kept []*endpoint) []string {
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
			up.p.log.Warn().Str("upstream", o.Name).Str("dns", o.Discover.DNS).Str("error", err.Error()).
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
func (up *upstream) endpoints(urls []string, kept []*endpoint, ramp bool) ([]*endpoint, error) {
	pool := make([]*endpoint, 0, len(urls))
	for _, u := range urls {
		spec := up.spec(u)
		var ep *endpoint
		for _, k := range kept {
			if reflect.DeepEqual(k.spec, spec) {
				ep = k
				break
			}
		}
		if ep == nil {
			var err error
			if ep, err = newEndpoint(up.name, spec, up.p.endpointBreakerChanged, up.p.modelBreakerChanged,
				up.p.evicted(mapModelBreakers)); err != nil {
				return nil, err
			}
			if ramp {
				ep.cameBack(time.Now())
			}
			ep.owner.Store(up) // a kept one changes hands once the table is live (own)
		}
		pool = append(pool, ep)
	}
	return pool, nil
}

// spec is the definition of the endpoint at url.
func (up *upstream) spec(url string) endpointSpec {
	o := up.opts
	s := endpointSpec{url: url, connect: o.ConnectTimeout, firstByte: o.FirstByteTimeout, idle: o.IdleTimeout,
		maxConns: o.MaxConnections, queue: o.QueueTimeout, breaker: o.Breaker, caFile: o.CAFile,
		insecure: o.InsecureSkipVerify}
	s.breaker.OnStateChange = nil
	if o.Discover.DNS != "" {
		s.hostName = o.Discover.DNS // verified by TLS and sent as Host, never the address
	}
	return s
}

// own makes up the owner of its endpoints, once its table is live: their
// breaker and health changes wake up's riders and count against its
// max_ejected. Endpoints a reload kept from an upstream whose health
// check changed (or went) are judged afresh, and those the previous
// upstream was draining are drained on here.
func (up *upstream) own() {
	for _, ep := range up.endpointsNow() {
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

// endpointsNow returns the endpoints taking requests.
func (up *upstream) endpointsNow() []*endpoint { return *up.pool.Load() }

// mayEject reports whether ep's connection breaker may open: the pool
// has fewer than max_ejected of its endpoints ejected (at least one may
// always be). It runs under ep's breaker lock and only reads atomics.
func (up *upstream) mayEject(ep *endpoint) bool {
	up.ejectMu.Lock()
	defer up.ejectMu.Unlock()
	pool := up.endpointsNow()
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

// notify wakes the requests waiting for an endpoint to come back.
func (up *upstream) notify() {
	up.changedMu.Lock()
	close(up.changed)
	up.changed = make(chan struct{})
	up.changedMu.Unlock()
}

// changes returns a channel closed at the next change of an endpoint.
func (up *upstream) changes() <-chan struct{} {
	up.changedMu.Lock()
	defer up.changedMu.Unlock()
	return up.changed
}

// start begins the upstream's background work, once: health checks and
// DNS discovery, when configured.
func (up *upstream) start() {
	up.startOnce.Do(func() {
		if up.opts.HealthCheck.Path != "" || up.opts.Discover.DNS != "" {
			go up.background()
		}
	})
}

// close stops the background work and lets go of the connections of the
// endpoints no newer upstream kept.
func (up *upstream) close() {
	up.quitOnce.Do(func() { close(up.quit) })
	for _, ep := range up.endpointsNow() {
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
