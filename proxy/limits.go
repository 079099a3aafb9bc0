package proxy

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// credSeed keys the hashes of client credentials for this process's own
// client buckets: they are keyed by a hash of a header value, never the
// value itself. (Cooldowns, which the fleet shares, use fleet.Digest: the
// same in every process.)
var credSeed = maphash.MakeSeed()

// credHash hashes a credential (an Authorization value, a client key).
func credHash(v []byte) uint64 { return maphash.Bytes(credSeed, v) }

// maxTrackedKeys bounds the per-credential maps; past it, expired entries
// are swept on insert.
const maxTrackedKeys = 10_000

// cooldowns remembers, per key (upstream credential and model), until
// when an upstream asked not to be sent requests (a 429 with
// Retry-After, x-ratelimit-remaining-*: 0, or a 429 that said nothing).
// One 429 is learned once: requests arriving meanwhile do not rediscover
// it.
type cooldowns struct {
	// latest is the UnixNano end of the latest cooldown ever set: before
	// it no lock is taken, so an upstream that never sent a 429 costs its
	// requests one atomic load. streaks counts the keys in a run of bare
	// 429s, so a success takes the lock only when one may end.
	latest  atomic.Int64
	streaks atomic.Int32
	mu      sync.Mutex
	m       map[uint64]cooldown
}

// cooldown is one key's: until when, and how many 429s without a wait in
// a row (each doubling the next cooldown).
type cooldown struct {
	until  time.Time
	streak int
}

// maxBareCooldown caps the doubling cooldown of 429s that say no wait.
const maxBareCooldown = 60 * time.Second

// set records a cooldown for key until t (an earlier one never shortens
// a later one).
func (c *cooldowns) set(key uint64, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.put(key, t, -1)
}

// adopt records a cooldown another replica learned, with its streak of
// bare 429s (0: none), so the next bare 429 here doubles on from it.
func (c *cooldowns) adopt(key uint64, t time.Time, streak int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if streak == 0 {
		streak = -1 // keep ours
	}
	c.put(key, t, streak)
}

// bare records a 429 that said no wait: a cooldown of base, doubling for
// each such 429 in a row (up to maxBareCooldown), from now; it returns
// its length and the streak. extend adds its random extension.
func (c *cooldowns) bare(key uint64, now time.Time, base time.Duration, extend func(time.Duration) time.Duration) (time.Duration, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	streak := 1
	if cd := c.m[key]; !stale(cd, now) {
		streak = cd.streak + 1
	}
	d := base
	for i := 1; i < streak && d < maxBareCooldown; i++ {
		d *= 2
	}
	d = extend(min(d, maxBareCooldown))
	c.put(key, now.Add(d), streak)
	return d, streak
}

// stale reports whether a run of bare 429s is over by itself: its last
// cooldown ended longer than the longest cooldown ago.
func stale(cd cooldown, now time.Time) bool {
	return cd.streak > 0 && now.Sub(cd.until) > maxBareCooldown
}

// put stores key's cooldown (streak -1: keep the streak); under mu.
func (c *cooldowns) put(key uint64, t time.Time, streak int) {
	if c.m == nil {
		c.m = map[uint64]cooldown{}
	}
	if len(c.m) >= maxTrackedKeys {
		now := time.Now()
		for k, cd := range c.m {
			if !cd.until.After(now) && (cd.streak == 0 || stale(cd, now)) {
				if cd.streak > 0 {
					c.streaks.Add(-1)
				}
				delete(c.m, k)
			}
		}
	}
	cd := c.m[key]
	if t.After(cd.until) {
		cd.until = t
	}
	if streak >= 0 {
		if cd.streak == 0 && streak > 0 {
			c.streaks.Add(1)
		}
		cd.streak = streak
	}
	c.m[key] = cd
	if n := t.UnixNano(); n > c.latest.Load() {
		c.latest.Store(n) // under mu: no lost update
	}
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
	if cd, ok := c.m[key]; ok && cd.streak > 0 {
		cd.streak = 0
		c.m[key] = cd
		c.streaks.Add(-1)
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
	cd, ok := c.m[key]
	if !ok || !cd.until.After(now) {
		return 0
	}
	return cd.until.Sub(now)
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

// clientLimiter is one `clients:` entry: a token bucket per client.
type clientLimiter struct {
	opts   ClientLimit
	header []byte
	mu     sync.Mutex
	bucket map[uint64]*clientBucket
}

type clientBucket struct {
	lim  *rate.Limiter
	seen time.Time
}

func newClientLimiter(o ClientLimit) *clientLimiter {
	return &clientLimiter{opts: o, header: []byte(o.KeyHeader), bucket: map[uint64]*clientBucket{}}
}

// take spends one token of the client whose key header holds key; it
// returns how long the client must wait when over its limit (never
// queued: the caller answers 429 at once).
func (l *clientLimiter) take(key []byte, now time.Time) (wait time.Duration, ok bool) {
	h := credHash(key)
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.bucket[h]
	if b == nil {
		if len(l.bucket) >= maxTrackedKeys {
			for k, old := range l.bucket {
				if now.Sub(old.seen) > 10*time.Minute {
					delete(l.bucket, k)
				}
			}
		}
		b = &clientBucket{lim: rate.NewLimiter(rate.Limit(l.opts.RequestsPerSecond), l.opts.Burst)}
		l.bucket[h] = b
	}
	b.seen = now
	r := b.lim.ReserveN(now, 1)
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
