package upstream

import (
	"container/heap"
	"sort"
	"sturdy/policy"
	"sync"
	"sync/atomic"
	"time"
)

// MaxTrackedKeys bounds each per-key map — the cooldowns of an upstream,
// the buckets of a `clients:` entry — and the cooldowns a replica loads
// from the fleet: keys come from clients (a credential, a model), so none
// can grow past it. An insert past it drops one entry (counted in
// sturdy_evictions_total): for cooldowns the one that ends soonest, for
// buckets the least recently used.
const MaxTrackedKeys = 100_000

// Cooldowns remembers, per key (upstream credential and model), until
// when an upstream asked not to be sent requests (a 429 with
// Retry-After, x-ratelimit-remaining-*: 0, or a 429 that said nothing),
// each capped at max. One 429 is learned once: requests arriving
// meanwhile do not rediscover it. It holds at most MaxTrackedKeys
// entries; a heap by end time finds the expired ones, and the one to
// drop, without walking the map.
type Cooldowns struct {
	// latest is the UnixNano end of the latest cooldown ever set: before
	// it no lock is taken, so an upstream that never sent a 429 costs its
	// requests one atomic load. streaks counts the keys in a run of bare
	// 429s, so a success takes the lock only when one may end.
	latest  atomic.Int64
	streaks atomic.Int32
	// max caps every cooldown learned or adopted (cooldown.max); 0: no
	// cap. onEvict counts an entry dropped for room. Both are set once,
	// before use.
	max     time.Duration
	onEvict func()
	mu      sync.Mutex
	m       map[uint64]*cooldown
	ends    endHeap
}

// cooldown is one key's: until when, and how many 429s without a wait in
// a row (each doubling the next cooldown); at is its place in the heap.
type cooldown struct {
	key    uint64
	until  time.Time
	streak int
	at     int
}

// useless is when the entry stops mattering: at its end, or for a run of
// bare 429s once the run is over by itself (stale).
func (cd *cooldown) useless() time.Time {
	if cd.streak > 0 {
		return cd.until.Add(maxBareCooldown)
	}
	return cd.until
}

// endHeap orders cooldowns by useless, soonest first (container/heap).
type endHeap []*cooldown

func (h endHeap) Len() int           { return len(h) }
func (h endHeap) Less(i, j int) bool { return h[i].useless().Before(h[j].useless()) }
func (h endHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].at, h[j].at = i, j
}
func (h *endHeap) Push(x any) {
	cd := x.(*cooldown)
	cd.at = len(*h)
	*h = append(*h, cd)
}
func (h *endHeap) Pop() any {
	old := *h
	cd := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return cd
}

// maxBareCooldown caps the doubling cooldown of 429s that say no wait.
const maxBareCooldown = 60 * time.Second

// capped returns t, or now + max when t is later (max 0: no cap).
func (c *Cooldowns) capped(now, t time.Time) time.Time {
	if c.max > 0 && t.Sub(now) > c.max {
		return now.Add(c.max)
	}
	return t
}

// Set records a cooldown for key until t, capped at max from now (an
// earlier one never shortens a later one), and returns the end it
// recorded for t.
func (c *Cooldowns) Set(key uint64, now, t time.Time) time.Time {
	t = c.capped(now, t)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.put(key, now, t, -1)
	return t
}

// Adopt records a cooldown another replica learned (capped at max from
// now, whatever it says), with its streak of bare 429s (0: none), so the
// next bare 429 here doubles on from it. It returns the end adopted.
func (c *Cooldowns) Adopt(key uint64, now, t time.Time, streak int) time.Time {
	t = c.capped(now, t)
	c.mu.Lock()
	defer c.mu.Unlock()
	if streak == 0 {
		streak = -1 // keep ours
	}
	c.put(key, now, t, streak)
	return t
}

// Bare records a 429 that said no wait: a cooldown of base, doubling for
// each such 429 in a row (up to maxBareCooldown, and max), from now; it
// returns its length and the streak. extend adds its random extension.
func (c *Cooldowns) Bare(key uint64, now time.Time, base time.Duration, extend func(time.Duration) time.Duration) (time.Duration, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	streak := 1
	if cd := c.m[key]; cd != nil && !stale(cd, now) {
		streak = cd.streak + 1
	}
	d := base
	for i := 1; i < streak && d < maxBareCooldown; i++ {
		d *= 2
	}
	d = c.capped(now, now.Add(extend(min(d, maxBareCooldown)))).Sub(now)
	c.put(key, now, now.Add(d), streak)
	return d, streak
}

// stale reports whether a run of bare 429s is over by itself: its last
// cooldown ended longer than the longest cooldown ago.
func stale(cd *cooldown, now time.Time) bool {
	return cd.streak > 0 && now.Sub(cd.until) > maxBareCooldown
}

// put stores key's cooldown (streak -1: keep the streak); under mu. The
// entries no longer of use go first; past MaxTrackedKeys the one that
// ends soonest makes room.
func (c *Cooldowns) put(key uint64, now, t time.Time, streak int) {
	if c.m == nil {
		c.m = map[uint64]*cooldown{}
	}
	for len(c.ends) > 0 && c.ends[0].useless().Before(now) && c.ends[0].key != key {
		c.drop(c.ends[0])
	}
	cd := c.m[key]
	if cd == nil {
		if len(c.m) >= MaxTrackedKeys {
			c.drop(c.ends[0])
			if c.onEvict != nil {
				c.onEvict()
			}
		}
		cd = &cooldown{key: key}
		c.m[key] = cd
		heap.Push(&c.ends, cd)
	}
	if t.After(cd.until) {
		cd.until = t
	}
	if streak >= 0 {
		switch {
		case cd.streak == 0 && streak > 0:
			c.streaks.Add(1)
		case cd.streak > 0 && streak == 0:
			c.streaks.Add(-1)
		}
		cd.streak = streak
	}
	heap.Fix(&c.ends, cd.at)
	if n := t.UnixNano(); n > c.latest.Load() {
		c.latest.Store(n) // under mu: no lost update
	}
}

// drop forgets cd; under mu.
func (c *Cooldowns) drop(cd *cooldown) {
	if cd.streak > 0 {
		c.streaks.Add(-1)
	}
	heap.Remove(&c.ends, cd.at)
	delete(c.m, cd.key)
}

// InStreak reports whether any key is in a run of bare 429s (one atomic
// load): only then is a success worth its key's hash.
func (c *Cooldowns) InStreak() bool { return c.streaks.Load() != 0 }

// Succeeded ends key's run of bare 429s.
func (c *Cooldowns) Succeeded(key uint64) {
	if !c.InStreak() {
		return
	}
	c.mu.Lock()
	if cd := c.m[key]; cd != nil && cd.streak > 0 {
		cd.streak = 0
		c.streaks.Add(-1)
		heap.Fix(&c.ends, cd.at)
	}
	c.mu.Unlock()
}

// Possible reports whether any cooldown may still be in force at now
// (one atomic load): only then is a key worth hashing and the lock worth
// taking.
func (c *Cooldowns) Possible(now time.Time) bool { return now.UnixNano() < c.latest.Load() }

// Remaining returns how long key's cooldown lasts from now (0: none).
func (c *Cooldowns) Remaining(key uint64, now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	cd := c.m[key]
	if cd == nil || !cd.until.After(now) {
		return 0
	}
	return cd.until.Sub(now)
}

// End returns when key's cooldown ends (zero: it has none).
func (c *Cooldowns) End(key uint64) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cd := c.m[key]; cd != nil {
		return cd.until
	}
	return time.Time{}
}

// Active counts the cooldowns in force and returns the latest end.
func (c *Cooldowns) Active(now time.Time) (n int, latest time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cd := range c.m {
		if cd.until.After(now) {
			n++
			if cd.until.After(latest) {
				latest = cd.until
			}
		}
	}
	return n, latest
}

// LeaseRequest is what a request asks of a lease — a max_in_flight slot,
// a connection place — and how long it may wait in the queue for one.
type LeaseRequest struct {
	// Wait is the longest the request may wait for a place; 0 or less:
	// only one free now.
	Wait time.Duration
	// Cancel ends the wait when closed (Sturdy shuts down); Gone when the
	// client left. Either may be nil.
	Cancel, Gone <-chan struct{}
	// Priority and Tenant are the request's class and who it is for (a
	// hash of its credential; 0: none): an endpoint's concurrency queue
	// serves interactive before batch and takes its tenants in turn;
	// max_in_flight's and max_connections' waits are first come, first
	// served.
	Priority Priority
	Tenant   uint64
}

// Priority is a request's class in a lease queue; zero is the default.
type Priority uint8

// LeaseResult is how a wait for a lease ended.
type LeaseResult uint8

// The ways a wait for a lease ends.
const (
	LeaseTaken     LeaseResult = iota // at once
	LeaseWaited                       // once one was freed
	LeaseTimedOut                     // none freed within the wait
	LeaseCancelled                    // Cancel or Gone closed first
)

// Slots bounds requests in flight: an upstream's max_in_flight, an
// endpoint's connection places (max_connections), the riders of an
// outage.
type Slots chan struct{}

// Acquire takes a slot, waiting up to r.Wait unless r.Cancel or r.Gone
// is closed first.
func (s Slots) Acquire(r LeaseRequest) LeaseResult {
	select {
	case s <- struct{}{}:
		return LeaseTaken
	default:
	}
	if r.Wait <= 0 {
		return LeaseTimedOut
	}
	t := time.NewTimer(r.Wait)
	defer t.Stop()
	select {
	case s <- struct{}{}:
		return LeaseWaited
	case <-t.C:
		return LeaseTimedOut
	case <-r.Cancel:
	case <-r.Gone:
	}
	return LeaseCancelled
}

// Release gives a slot back.
func (s Slots) Release() { <-s }

// Sample is what an attempt reports of its lease (Observe, Release): its time
// to first token — from sending to the first output held (a stream's
// commit point, a whole small reply's head) — and whether the sample
// Counts. It does not for a stale connection's replay, an attempt whose
// client left, or one that failed before it was sent (a failed dial, no
// connection): their times say nothing of the endpoint's load.
type Sample struct {
	TTFT   time.Duration
	Counts bool
	// Streamed says the reply is a stream, whose TTFT is its first
	// content's (an adaptive limit's signal; a non-streamed reply's first
	// byte comes when generation ends, mixing in its length). Size is the
	// request body's, for its prompt-size baseline. Overload says the
	// attempt met a 503/529, a timeout or a failed connection: an
	// adaptive limit backs off.
	Streamed bool
	Size     int
	Overload bool
}

// Lease is an attempt's place on an endpoint — its connection place
// (max_connections) and, with concurrency on, its place under the
// endpoint's limit — held until its reply's body is closed; the zero
// Lease holds nothing. One refused says which limit refused it and how
// soon a place is likely free (Refusal).
type Lease struct {
	ep *Endpoint
	// conc says it holds a concurrency place, of class pr, taken at taken.
	conc  bool
	pr    Priority
	taken time.Time
	// by and retryAfter are a refusal's (by "": max_connections).
	by         string
	retryAfter time.Duration
}

// Refusal says, of a lease not taken, which limit refused it —
// "concurrency" or "max_connections" — and, for the concurrency limit,
// how soon a place is likely free (from its queue's drain; 0: unknown).
func (l Lease) Refusal() (limit string, retryAfter time.Duration) {
	if l.by == "" {
		return "max_connections", 0
	}
	return l.by, l.retryAfter
}

// Held reports whether l holds a place.
func (l Lease) Held() bool { return l.ep != nil }

// Observe feeds a stream's first content (s, Streamed and Counts) to
// the endpoint's adaptive limit the moment it is known. Fed when the
// place is given back, the signal would come a whole reply late: the
// limit grew for that long past the server's capacity before it heard
// of it, and swung (1 to 17 on 8 slots in the bench's overload
// scenario).
func (l Lease) Observe(s Sample) {
	if l.conc {
		l.ep.conc.observe(s)
	}
}

// Release gives the place back with the attempt's last sample (s): its
// ttft is recorded on the endpoint when it counts, and an overload backs
// an adaptive limit off.
func (l Lease) Release(s Sample) {
	if l.ep == nil {
		return
	}
	if s.Counts {
		l.ep.lastTTFT.Store(int64(s.TTFT))
		l.ep.samples.Add(1)
	}
	l.ep.conns.Release()
	if l.conc {
		l.ep.conc.release(l.pr, s, l.taken, time.Now())
	}
}

// ModelTokens is one glob of an upstream's tokens_per_minute and its
// window, shared by every model it matches.
type ModelTokens struct {
	Glob   string
	Limit  int64
	Window *policy.TokenWindow
}

// buildTokens makes o's tokens_per_minute windows, most literal glob
// first (the one a model takes: Tokens), keeping prev's window of a glob
// it had too (a reload keeps what was spent, under the new limit).
func buildTokens(o Options, prev *Upstream) []ModelTokens {
	if len(o.TokensPerMinute) == 0 {
		return nil
	}
	kept := map[string]*policy.TokenWindow{}
	if prev != nil {
		for _, mt := range prev.tokens {
			kept[mt.Glob] = mt.Window
		}
	}
	out := make([]ModelTokens, 0, len(o.TokensPerMinute))
	for glob, limit := range o.TokensPerMinute {
		w := kept[glob]
		if w == nil {
			w = new(policy.TokenWindow)
		}
		w.SetLimit(limit)
		out = append(out, ModelTokens{Glob: glob, Limit: limit, Window: w})
	}
	sort.Slice(out, func(i, j int) bool {
		if a, b := policy.GlobSpecificity(out[i].Glob), policy.GlobSpecificity(out[j].Glob); a != b {
			return a > b
		}
		return out[i].Glob < out[j].Glob
	})
	return out
}
