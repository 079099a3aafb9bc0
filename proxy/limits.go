package proxy

import (
	"container/heap"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"golang.org/x/time/rate"
)

// credSeed keys the hashes of client credentials for this process's own
// client buckets: they are keyed by a hash of a header value, never the
// value itself. (Cooldowns, which the fleet shares, use fleet.Digest: the
// same in every process.)
var credSeed = maphash.MakeSeed()

// credHash hashes a credential (an Authorization value, a client key).
func credHash(v []byte) uint64 { return maphash.Bytes(credSeed, v) }

// MaxTrackedKeys bounds each per-key map — the cooldowns of an upstream,
// the buckets of a `clients:` entry — and the cooldowns a replica loads
// from the fleet: keys come from clients (a credential, a model), so none
// can grow past it. An insert past it drops one entry (counted in
// sturdy_evictions_total): for cooldowns the one that ends soonest, for
// buckets the least recently used.
const MaxTrackedKeys = 100_000

// cooldowns remembers, per key (upstream credential and model), until
// when an upstream asked not to be sent requests (a 429 with
// Retry-After, x-ratelimit-remaining-*: 0, or a 429 that said nothing),
// each capped at max. One 429 is learned once: requests arriving
// meanwhile do not rediscover it. It holds at most MaxTrackedKeys
// entries; a heap by end time finds the expired ones, and the one to
// drop, without walking the map.
type cooldowns struct {
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
func (c *cooldowns) capped(now, t time.Time) time.Time {
	if c.max > 0 && t.Sub(now) > c.max {
		return now.Add(c.max)
	}
	return t
}

// set records a cooldown for key until t, capped at max from now (an
// earlier one never shortens a later one), and returns the end it
// recorded for t.
func (c *cooldowns) set(key uint64, now, t time.Time) time.Time {
	t = c.capped(now, t)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.put(key, now, t, -1)
	return t
}

// adopt records a cooldown another replica learned (capped at max from
// now, whatever it says), with its streak of bare 429s (0: none), so the
// next bare 429 here doubles on from it. It returns the end adopted.
func (c *cooldowns) adopt(key uint64, now, t time.Time, streak int) time.Time {
	t = c.capped(now, t)
	c.mu.Lock()
	defer c.mu.Unlock()
	if streak == 0 {
		streak = -1 // keep ours
	}
	c.put(key, now, t, streak)
	return t
}

// bare records a 429 that said no wait: a cooldown of base, doubling for
// each such 429 in a row (up to maxBareCooldown, and max), from now; it
// returns its length and the streak. extend adds its random extension.
func (c *cooldowns) bare(key uint64, now time.Time, base time.Duration, extend func(time.Duration) time.Duration) (time.Duration, int) {
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
func (c *cooldowns) put(key uint64, now, t time.Time, streak int) {
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
func (c *cooldowns) drop(cd *cooldown) {
	if cd.streak > 0 {
		c.streaks.Add(-1)
	}
	heap.Remove(&c.ends, cd.at)
	delete(c.m, cd.key)
}

// inStreak reports whether any key is in a run of bare 429s (one atomic
// load): only then is a success worth its key's hash.
func (c *cooldowns) inStreak() bool { return c.streaks.Load() != 0 }

// succeeded ends key's run of bare 429s.
func (c *cooldowns) succeeded(key uint64) {
	if !c.inStreak() {
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

// possible reports whether any cooldown may still be in force at now
// (one atomic load): only then is a key worth hashing and the lock worth
// taking.
func (c *cooldowns) possible(now time.Time) bool { return now.UnixNano() < c.latest.Load() }

// remaining returns how long key's cooldown lasts from now (0: none).
func (c *cooldowns) remaining(key uint64, now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	cd := c.m[key]
	if cd == nil || !cd.until.After(now) {
		return 0
	}
	return cd.until.Sub(now)
}

// end returns when key's cooldown ends (zero: it has none).
func (c *cooldowns) end(key uint64) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cd := c.m[key]; cd != nil {
		return cd.until
	}
	return time.Time{}
}

// active counts the cooldowns in force and returns the latest end.
func (c *cooldowns) active(now time.Time) (n int, latest time.Time) {
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

// clientLimiter is one `clients:` entry: a token bucket per client, at
// most MaxTrackedKeys of them (the least recently used goes).
type clientLimiter struct {
	opts    ClientLimit
	header  []byte
	onEvict func()
	mu      sync.Mutex
	buckets *simplelru.LRU[uint64, *rate.Limiter]
}

func newClientLimiter(o ClientLimit, onEvict func()) *clientLimiter {
	buckets, _ := simplelru.NewLRU[uint64, *rate.Limiter](MaxTrackedKeys, nil) // cannot fail: the size is > 0
	return &clientLimiter{opts: o, header: []byte(o.KeyHeader), onEvict: onEvict, buckets: buckets}
}

// take spends one token of the client whose key header holds key; it
// returns how long the client must wait when over its limit (never
// queued: the caller answers 429 at once).
func (l *clientLimiter) take(key []byte, now time.Time) (wait time.Duration, ok bool) {
	h := credHash(key)
	l.mu.Lock()
	defer l.mu.Unlock()
	lim, found := l.buckets.Get(h)
	if !found {
		lim = rate.NewLimiter(rate.Limit(l.opts.RequestsPerSecond), l.opts.Burst)
		if l.buckets.Add(h, lim) && l.onEvict != nil {
			l.onEvict()
		}
	}
	r := lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return d, false
	}
	return 0, true
}

// slots bounds the requests in flight to an upstream (max_in_flight).
type slots chan struct{}

// slotResult is how acquire ended.
type slotResult uint8

const (
	slotTaken     slotResult = iota // at once
	slotWaited                      // once one was freed
	slotTimedOut                    // none freed within the wait
	slotCancelled                   // cancel or gone fired first
)

// acquire takes a slot, waiting up to wait unless cancel or gone is
// closed first.
func (s slots) acquire(wait time.Duration, cancel, gone <-chan struct{}) slotResult {
	select {
	case s <- struct{}{}:
		return slotTaken
	default:
	}
	if wait <= 0 {
		return slotTimedOut
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case s <- struct{}{}:
		return slotWaited
	case <-t.C:
		return slotTimedOut
	case <-cancel:
	case <-gone:
	}
	return slotCancelled
}

func (s slots) release() { <-s }
