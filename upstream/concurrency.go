package upstream

import (
	"math"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"

	"sturdy/units"
)

// The concurrency defaults (concurrency:).
const (
	DefaultConcurrencyMax  = 64
	DefaultAdaptiveMin     = 1
	DefaultAdaptiveInitial = 4
	DefaultTolerance       = 1.5
	DefaultSmoothing       = 0.2
	DefaultMinSamples      = 8
	DefaultQueueMax        = 128
	DefaultBatchShare      = 0.75
)

// Concurrency limits the requests in flight on each endpoint of a pool
// (concurrency:), with a queue in front of the limit. Mode off leaves
// only max_in_flight (pool-wide) and max_connections.
type Concurrency struct {
	// Mode is how each endpoint's requests in flight are limited: off,
	// fixed (max in flight) or adaptive (a limit that follows the
	// endpoint's time to first content, up to max). Default `off`.
	Mode ConcurrencyMode `yaml:"mode"`
	// Max is each endpoint's limit in mode fixed, its ceiling in mode
	// adaptive. Default 64.
	Max int `yaml:"max"`
	// Adaptive tunes mode adaptive's law.
	Adaptive Adaptive `yaml:"adaptive"`
	// Queue bounds the requests waiting for a place under an endpoint's
	// limit; past it, 503 upstream_busy with a Retry-After from the
	// queue's drain, or a fallback.
	Queue Queue `yaml:"queue"`
	// BatchShare is the most of an endpoint's limit batch requests may
	// hold at once, so an interactive one finds a place. Default 75%.
	BatchShare units.Percent `yaml:"batch_share"`
}

// Adaptive tunes mode adaptive (Gradient2 on the time to first content
// of streamed replies; see gradient).
type Adaptive struct {
	// Min is the lowest the limit goes. Default 1.
	Min int `yaml:"min"`
	// Initial is where the limit starts. Default 4.
	Initial int `yaml:"initial"`
	// Tolerance is how much slower than its baseline a reply may start
	// before the limit comes down (1.5: half again). Default 1.5.
	Tolerance float64 `yaml:"tolerance"`
	// Smoothing is the share of a decrease applied per round: a limit's
	// worth of samples, 1/limit of it each. Default 0.2.
	Smoothing float64 `yaml:"smoothing"`
	// MinSamples is how many samples a prompt-size bucket needs before
	// they move the limit. Default 8.
	MinSamples int `yaml:"min_samples"`
}

// Queue bounds the requests waiting for a place under an endpoint's
// limit.
type Queue struct {
	// Max is how many requests may wait per endpoint (a pool of two
	// holds up to twice this). Default 128.
	Max int `yaml:"max"`
	// Timeout is the longest each waits. It is the upstream's
	// queue_timeout: either key sets both. Default 5s.
	Timeout time.Duration `yaml:"timeout"`
}

// ConcurrencyMode is how an endpoint's concurrency is limited.
type ConcurrencyMode uint8

// The concurrency modes.
const (
	// ConcurrencyOff: no per-endpoint limit.
	ConcurrencyOff ConcurrencyMode = iota
	// ConcurrencyFixed: Max in flight per endpoint.
	ConcurrencyFixed
	// ConcurrencyAdaptive: a limit that follows the endpoint's own
	// latency, between Adaptive.Min and Max.
	ConcurrencyAdaptive
)

var concurrencyModes = map[string]ConcurrencyMode{"": ConcurrencyOff, "off": ConcurrencyOff, "fixed": ConcurrencyFixed,
	"adaptive": ConcurrencyAdaptive}

// UnmarshalYAML reads off, fixed or adaptive.
func (m *ConcurrencyMode) UnmarshalYAML(n *yaml.Node) (err error) {
	*m, err = units.Enum(n, concurrencyModes, "off, fixed or adaptive")
	return err
}

// String is the mode's name in the config file.
func (m ConcurrencyMode) String() string {
	return [...]string{"off", "fixed", "adaptive"}[m]
}

// withDefaults fills c's zero fields; queueTimeout is the upstream's.
func (c Concurrency) withDefaults(queueTimeout time.Duration) Concurrency {
	OrDefault(&c.Max, DefaultConcurrencyMax)
	OrDefault(&c.Adaptive.Min, DefaultAdaptiveMin)
	OrDefault(&c.Adaptive.Initial, DefaultAdaptiveInitial)
	OrDefault(&c.Adaptive.Tolerance, DefaultTolerance)
	OrDefault(&c.Adaptive.Smoothing, DefaultSmoothing)
	OrDefault(&c.Adaptive.MinSamples, DefaultMinSamples)
	OrDefault(&c.Queue.Max, DefaultQueueMax)
	OrDefault(&c.Queue.Timeout, queueTimeout)
	OrDefault(&c.BatchShare, DefaultBatchShare)
	c.Adaptive.Min = min(c.Adaptive.Min, c.Max)
	c.Adaptive.Initial = max(min(c.Adaptive.Initial, c.Max), c.Adaptive.Min)
	return c
}

// The priority classes of a lease queue: interactive (the default) goes
// first; batch keeps a reserved share of the places freed (batchTurn) and
// holds at most Concurrency.BatchShare of the limit.
const (
	PriorityInteractive Priority = iota
	PriorityBatch
)

var priorities = map[string]Priority{"": PriorityInteractive, "interactive": PriorityInteractive, "batch": PriorityBatch}

// ParsePriority reads a class's name (interactive or batch, any case).
func ParsePriority(s string) (Priority, bool) {
	p, ok := priorities[strings.ToLower(s)]
	return p, ok
}

// UnmarshalYAML reads interactive or batch.
func (p *Priority) UnmarshalYAML(n *yaml.Node) (err error) {
	*p, err = units.Enum(n, priorities, "interactive or batch")
	return err
}

// String is the class's name.
func (p Priority) String() string {
	if p == PriorityBatch {
		return "batch"
	}
	return "interactive"
}

// batchTurn: every batchTurn-th place freed while batch requests wait
// goes to one of them, so batch is never starved by interactive.
const batchTurn = 4

// gradient is Gradient2's control law (Netflix concurrency-limits) on an
// endpoint's time to first content of streamed replies, from dispatch:
// per prompt-size bucket a long average (an EWMA over about longWindow
// samples, slow and fast alike, of the replies Sturdy's own load did not
// slow — never a minimum, which ratchets under sustained load; see
// learn) and a short one of each sample's ratio to it; gradient
// = clamp(tolerance ÷ short, 0.5, 1); new limit = limit · gradient, + 1
// while the gradient is 1 and the sample itself kept pace; a decrease
// smoothed (smoothing of it). That step is taken once a round — a limit's
// worth of samples — spread over the round's samples (1/limit of it
// each): a sample comes as a stream's first content does, a time to
// first content after dispatch, but a place is freed only as the reply
// ends, and a step per sample overshot to twice a server's slots and fell
// to 1, again and again (the bench's overload scenario, and
// TestTheGradientSettlesOnAStreamingServer). The queue allowance is 1, not
// Gradient2's constant 4: on a server with 8 slots an allowance of 4
// would hold the limit half again above its capacity, and one added while
// the limit comes down would hold it at twice itself however slow the
// replies (the floor is where a baseline is learned under saturation).
// The limit does not grow while fewer than half of it are in flight. It
// holds no lock: its endpoint's concurrency does.
type gradient struct {
	o     Adaptive
	max   float64
	limit float64
	// short is the EWMA of recent samples' ratio to their bucket's long
	// average (1: as fast as usual).
	short   float64
	buckets [promptBuckets]baseline
}

// baseline is one prompt-size bucket's long average, in nanoseconds, of
// n samples since it was (re)learned.
type baseline struct {
	long float64
	n    int
	// samples counts every sample it had (n restarts when relearning).
	samples int
}

// promptBuckets are the prompt sizes baselines are kept for: a request
// body under 2 KiB, 8, 32, 128 KiB, and larger. TTFT grows with the
// prompt (prefill), so one baseline for all would read a long prompt as
// load; with a server's prefix cache it follows the uncached part, which
// the body's size only bounds.
const promptBuckets = 5

// longWindow is about how many samples a bucket's long average spans;
// shortWeight is a sample's weight in the short one.
const (
	longWindow  = 50
	shortWeight = 0.25
	// relearnAt: a short ratio under it says the replies come at under
	// half their baseline: Gradient2 decays its long average there; one
	// learned like this one learns it again.
	relearnAt = 0.5
)

func promptBucket(size int) int {
	b := 0
	for limit := 2 << 10; b < promptBuckets-1 && size >= limit; limit <<= 2 {
		b++
	}
	return b
}

func newGradient(c Concurrency) gradient {
	return gradient{o: c.Adaptive, max: float64(c.Max), limit: float64(c.Adaptive.Initial), short: 1}
}

// sample moves the limit by one sample: ttft of a reply to a request of
// size bytes, inFlight in flight (it among them) when it came.
func (g *gradient) sample(ttft time.Duration, size, inFlight int) {
	t := float64(ttft)
	if t <= 0 {
		return
	}
	b := &g.buckets[promptBucket(size)]
	b.samples++
	if b.n < g.o.MinSamples { // learning it: from the fastest, which the least queueing slowed
		if b.n++; b.n == 1 || t < b.long {
			b.long = t
		}
		return
	}
	if g.short < relearnAt {
		// The replies left this baseline behind (a faster model, a
		// prefix cache warmed): it is learned again, as at the start.
		b.n, g.short = 0, 1
		return
	}
	b.n++
	b.long += (t - b.long) * g.learn(b.n, inFlight)
	g.short += (t/b.long - g.short) * shortWeight
	grad := math.Max(0.5, math.Min(1, g.o.Tolerance/g.short))
	// One step a round, spread over its samples (see gradient).
	next := g.limit * grad
	if grad == 1 && t/b.long <= g.o.Tolerance {
		next++ // the queue allowance: only while the replies keep pace, this one too
	}
	switch {
	case next > g.limit && float64(inFlight) < g.limit/2:
		return // not using what it has: no sign it could use more
	case next < g.limit:
		next = g.limit*(1-g.o.Smoothing) + next*g.o.Smoothing
	}
	next = g.limit + (next-g.limit)/g.limit
	g.limit = math.Max(float64(g.o.Min), math.Min(g.max, next))
}

// learn is the weight of a sample in its bucket's long average (the
// bucket's n-th): the long average follows slow and fast samples alike —
// a baseline fed only the fast ones ratchets down under ordinary noise,
// one fed every sample ratchets up under sustained queueing — but only
// those taken with at most half the limit (or the floor) in flight, which
// did not wait behind Sturdy's own load. Under saturation that is when
// the limit is near its floor: a baseline too low (the fastest of the
// first samples, under noise) brings the limit down until it is learned
// again; one that truly moved (another model) is learned there in tens of
// samples.
func (g *gradient) learn(n, inFlight int) float64 {
	if float64(inFlight) > math.Max(float64(g.o.Min), g.limit/2) {
		return 0
	}
	return 1 / float64(min(n, longWindow))
}

// backoff cuts the limit by a fifth: a 503/529, a timeout or a failed
// connection said the endpoint is overloaded (a 429 says the quota is
// spent, not the server: never here).
func (g *gradient) backoff() {
	g.limit = math.Max(float64(g.o.Min), g.limit*0.8)
}

// probe raises a limit that back-offs took below the initial one by a
// step a round (1/limit a reply), when a reply that is no stream — which
// gives no sample — ended well with the limit full (inFlight at it):
// without it, an endpoint serving only whole replies stayed at the floor
// its 503s left it, however idle its server. Streams move the limit by
// their samples instead.
func (g *gradient) probe(inFlight int) {
	if initial := float64(g.o.Initial); g.limit < initial && float64(inFlight) >= math.Floor(g.limit) {
		g.limit = math.Min(initial, g.limit+1/g.limit)
	}
}

// concurrency is one endpoint's limit and the queue in front of it.
type concurrency struct {
	opts Concurrency
	mu   sync.Mutex
	g    gradient
	// inFlight and batch are the places held (batch: by batch requests).
	inFlight, batch int
	// queues are the waiting requests per class; waiting is their count.
	queues  [2]tenantQueue
	waiting int
	// turn counts the places given to interactive requests since batch
	// last had one while batch requests waited (batchTurn).
	turn int
	// gap is the EWMA of the time between places freed (the queue's
	// drain), lastFree when one was last freed: the wait a shed request
	// is told.
	gap      float64
	lastFree time.Time
	// backedOff is when an overload last backed the limit off: the
	// requests already in flight then were sent under the limit it cut,
	// and their overloads do not cut it again (once per round trip, not
	// once per request of a burst).
	backedOff time.Time
}

func newConcurrency(c Concurrency) *concurrency {
	if c.Mode == ConcurrencyOff {
		return nil
	}
	cc := &concurrency{opts: c, g: newGradient(c)}
	if c.Mode == ConcurrencyFixed {
		cc.g.limit = float64(c.Max)
	}
	return cc
}

// limit is the places the endpoint has now; under mu.
func (c *concurrency) limit() int { return max(1, int(c.g.limit)) }

// batchCap is the most places batch requests may hold; under mu.
func (c *concurrency) batchCap() int {
	return max(1, int(float64(c.limit())*float64(c.opts.BatchShare)))
}

// free reports whether a request of class pr may take a place now; under mu.
func (c *concurrency) free(pr Priority) bool {
	return c.inFlight < c.limit() && (pr != PriorityBatch || c.batch < c.batchCap())
}

// take gives a place to a request of class pr; under mu.
func (c *concurrency) take(pr Priority) {
	c.inFlight++
	if pr == PriorityBatch {
		c.batch++
	}
}

// waiter is a request waiting in the queue: ready is closed once it was
// given a place (granted, under mu).
type waiter struct {
	ready   chan struct{}
	pr      Priority
	tenant  uint64
	granted bool
	// shed says ready was closed to turn it away: a newcomer took its
	// place in a full queue (displace).
	shed bool
}

// tenantQueue is one class's waiters: a FIFO per tenant, served in turn
// (round robin across tenants), so one tenant's burst does not hold the
// others back.
type tenantQueue struct {
	byTenant map[uint64][]*waiter
	order    []uint64 // tenants with waiters, in turn
}

func (q *tenantQueue) push(w *waiter) {
	if q.byTenant == nil {
		q.byTenant = map[uint64][]*waiter{}
	}
	if len(q.byTenant[w.tenant]) == 0 {
		q.order = append(q.order, w.tenant)
	}
	q.byTenant[w.tenant] = append(q.byTenant[w.tenant], w)
}

// pop takes the next tenant's first waiter (nil: none), that tenant
// going to the back of the turn.
func (q *tenantQueue) pop() *waiter {
	if len(q.order) == 0 {
		return nil
	}
	t := q.order[0]
	ws := q.byTenant[t]
	w := ws[0]
	ws[0] = nil
	q.order = q.order[1:]
	if ws = ws[1:]; len(ws) > 0 {
		q.byTenant[t] = ws
		q.order = append(q.order, t)
	} else {
		delete(q.byTenant, t)
	}
	return w
}

// remove takes w out (it gave up waiting).
func (q *tenantQueue) remove(w *waiter) {
	ws := q.byTenant[w.tenant]
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) > 0 {
		q.byTenant[w.tenant] = ws
		return
	}
	delete(q.byTenant, w.tenant)
	for i, t := range q.order {
		if t == w.tenant {
			q.order = append(q.order[:i], q.order[i+1:]...)
			break
		}
	}
}

func (q *tenantQueue) empty() bool { return len(q.order) == 0 }

// acquire takes a place for r, waiting in the queue up to r.Wait (and
// the queue's timeout) unless r.Cancel or r.Gone closes first. A full
// queue sheds r at once (LeaseTimedOut); retryAfter is then, and on a
// timeout, how soon a place is likely free, from the queue's drain.
func (c *concurrency) acquire(r LeaseRequest) (res LeaseResult, retryAfter time.Duration) {
	pr := r.Priority
	c.mu.Lock()
	// Nobody of its class waits ahead of it (batch held back at its
	// share does not hold interactive up), and a place is free.
	if c.free(pr) && (c.waiting == 0 || pr == PriorityInteractive && c.queues[PriorityInteractive].empty()) {
		c.take(pr)
		c.mu.Unlock()
		return LeaseTaken, 0
	}
	wait := min(r.Wait, c.opts.Queue.Timeout)
	if wait <= 0 || c.waiting >= c.opts.Queue.Max && !c.displace(pr, r.Tenant) {
		ra := c.drainWait(time.Now())
		c.mu.Unlock()
		return LeaseTimedOut, ra
	}
	w := &waiter{ready: make(chan struct{}), pr: pr, tenant: r.Tenant}
	c.queues[pr].push(w)
	c.waiting++
	c.mu.Unlock()
	t := time.NewTimer(wait)
	defer t.Stop()
	res = LeaseCancelled
	select {
	case <-w.ready:
		if w.shed {
			c.mu.Lock()
			defer c.mu.Unlock()
			return LeaseTimedOut, c.drainWait(time.Now())
		}
		return LeaseWaited, 0
	case <-t.C:
		res = LeaseTimedOut
	case <-r.Cancel:
	case <-r.Gone:
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case w.granted: // given a place as the wait ended: it goes back
		c.put(pr)
	case w.shed: // turned away as the wait ended: out of the queue already
		res = LeaseTimedOut
	default:
		c.queues[pr].remove(w)
		c.waiting--
	}
	return res, c.drainWait(time.Now())
}

// displace makes room in a full queue for a newcomer of class pr and
// tenant: the newest waiter of the tenant with the most waiters is
// turned away — a batch one first, for an interactive newcomer — when
// that tenant waits with more than the newcomer's would once it joined
// (so a tenant flooding the queue cannot shut the others out of it, and
// the queue's length stays bounded). false: nobody is displaced, the
// newcomer is shed. Under mu.
func (c *concurrency) displace(pr Priority, tenant uint64) bool {
	for class := PriorityBatch; ; class-- {
		q := &c.queues[class]
		mine := len(q.byTenant[tenant])
		if class != pr {
			mine = -1 // any batch waiter gives way to an interactive newcomer
		}
		fattest, most := uint64(0), 0
		for t, ws := range q.byTenant {
			if len(ws) > most {
				fattest, most = t, len(ws)
			}
		}
		if most > mine+1 {
			ws := q.byTenant[fattest]
			w := ws[len(ws)-1]
			q.remove(w)
			c.waiting--
			w.shed = true
			close(w.ready)
			return true
		}
		if class == pr || class == PriorityInteractive {
			return false
		}
	}
}

// drainWait is how long until the queue's last waiter would get a place
// at the rate places were freed lately — no faster than the time since
// the last one was (a stalled queue is not draining) — at least
// minDrainWait, at most the queue's timeout; under mu.
func (c *concurrency) drainWait(now time.Time) time.Duration {
	if c.gap <= 0 {
		return c.opts.Queue.Timeout
	}
	gap := math.Max(c.gap, float64(now.Sub(c.lastFree)))
	d := time.Duration(gap * float64(c.waiting+1))
	return min(max(d, minDrainWait), c.opts.Queue.Timeout)
}

// minDrainWait is the least wait a shed request is told: SDKs honour
// retry-after-ms, and a retry a millisecond later finds the queue as full.
const minDrainWait = 100 * time.Millisecond

// put frees a place of class pr and gives it to the next waiter (grant);
// under mu.
func (c *concurrency) put(pr Priority) {
	c.inFlight--
	if pr == PriorityBatch {
		c.batch--
	}
	c.grant()
}

// grant gives the places free under the limit to the waiters: interactive
// first, batch every batchTurn-th time while it waits, never past batch's
// share; under mu.
func (c *concurrency) grant() {
	for c.waiting > 0 && c.inFlight < c.limit() {
		next := PriorityInteractive
		batchWaits := !c.queues[PriorityBatch].empty() && c.batch < c.batchCap()
		if c.queues[PriorityInteractive].empty() || (batchWaits && c.turn >= batchTurn-1) {
			next = PriorityBatch
		}
		if next == PriorityBatch && !batchWaits {
			return // only batch waits, and it holds its share
		}
		w := c.queues[next].pop()
		c.waiting--
		if next == PriorityBatch {
			c.turn = 0
		} else if batchWaits {
			c.turn++
		}
		c.take(next)
		w.granted = true
		close(w.ready)
	}
}

// release gives back a place of class pr, taken at taken, with what the
// attempt that held it reports (s): an overload backs an adaptive limit
// off (once per round trip: see backedOff). A stream's first content
// moved it already, as it came (observe).
func (c *concurrency) release(pr Priority, s Sample, taken, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.lastFree.IsZero() {
		gap := float64(now.Sub(c.lastFree))
		if c.gap == 0 {
			c.gap = gap
		} else {
			c.gap += (gap - c.gap) * shortWeight
		}
	}
	c.lastFree = now
	switch {
	case c.opts.Mode != ConcurrencyAdaptive:
	case s.Overload && taken.After(c.backedOff):
		c.g.backoff()
		c.backedOff = now
	case !s.Overload && s.Counts && !s.Streamed:
		c.g.probe(c.inFlight)
	}
	c.put(pr)
}

// observe moves an adaptive limit by a stream's first content (s) as it
// comes, its place still held (so counted in flight).
func (c *concurrency) observe(s Sample) {
	if c.opts.Mode != ConcurrencyAdaptive || !s.Counts || !s.Streamed {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.g.sample(s.TTFT, s.Size, c.inFlight)
	c.grant() // a limit that grew has places for the waiters now, not at the next reply's end
}

// room is the endpoint's limit now, whether every place under it is
// taken (a request there would queue) and whether its queue is full too
// (one there would be shed): a pool balances by headroom and sends a
// request elsewhere before it is shed.
func (c *concurrency) room() (limit int, full, shedding bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	full = c.inFlight >= c.limit()
	return c.limit(), full, full && c.waiting >= c.opts.Queue.Max
}

// ConcurrencyStatus is an endpoint's concurrency as /debug/upstreams
// shows it.
type ConcurrencyStatus struct {
	Mode     string  `json:"mode"`
	Limit    int     `json:"limit"`
	InFlight int     `json:"in_flight"`
	Queued   [2]int  `json:"queued"` // interactive, batch
	Short    float64 `json:"short_ratio"`
	// Long is each prompt-size bucket's long average in milliseconds
	// (bodies under 2 KiB, 8, 32, 128 KiB, larger; 0: none yet), Samples
	// how many samples it has had.
	Long    [promptBuckets]float64 `json:"long_ms"`
	Samples [promptBuckets]int     `json:"samples"`
}

func (c *concurrency) status() *ConcurrencyStatus {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	st := &ConcurrencyStatus{Mode: c.opts.Mode.String(), Limit: c.limit(), InFlight: c.inFlight, Short: c.g.short}
	for i, b := range c.g.buckets {
		st.Long[i], st.Samples[i] = b.long/float64(time.Millisecond), b.samples
	}
	for i := range c.queues {
		for _, ws := range c.queues[i].byTenant {
			st.Queued[i] += len(ws)
		}
	}
	return st
}

// Adaptive reports whether ep's concurrency limit is adaptive: then a
// 503/529 feeds the limit (it backs off) rather than the reply breaker.
func (ep *Endpoint) Adaptive() bool {
	return ep.conc != nil && ep.conc.opts.Mode == ConcurrencyAdaptive
}

// Concurrent reports whether ep has a concurrency limit (its queue is the
// wait source "concurrency").
func (ep *Endpoint) Concurrent() bool { return ep.conc != nil }
