package proxy

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// credSeed keys the hashes of client credentials: cooldowns and client
// limits are keyed by a hash of a header value, never the value itself.
var credSeed = maphash.MakeSeed()

// credHash hashes a credential (an Authorization value, a client key).
func credHash(v []byte) uint64 { return maphash.Bytes(credSeed, v) }

// maxTrackedKeys bounds the per-credential maps; past it, expired entries
// are swept on insert.
const maxTrackedKeys = 10_000

// cooldowns remembers, per credential, until when an upstream asked not to
// be sent requests (a 429 with Retry-After, or x-ratelimit-remaining: 0).
// One 429 is learned once: requests arriving meanwhile do not rediscover
// it.
type cooldowns struct {
	// latest is the UnixNano end of the latest cooldown ever set: before
	// it no lock is taken, so an upstream that never sent a 429 costs its
	// requests one atomic load.
	latest atomic.Int64
	mu     sync.Mutex
	until  map[uint64]time.Time
}

// set records a cooldown for cred until t (an earlier one never shortens
// a later one).
func (c *cooldowns) set(cred uint64, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.until == nil {
		c.until = map[uint64]time.Time{}
	}
	if len(c.until) >= maxTrackedKeys {
		now := time.Now()
		for k, u := range c.until {
			if !u.After(now) {
				delete(c.until, k)
			}
		}
	}
	if t.After(c.until[cred]) {
		c.until[cred] = t
	}
	if n := t.UnixNano(); n > c.latest.Load() {
		c.latest.Store(n) // under mu: no lost update
	}
}

// possible reports whether any cooldown may still be in force at now
// (one atomic load): only then is a credential worth hashing and the lock
// worth taking.
func (c *cooldowns) possible(now time.Time) bool { return now.UnixNano() < c.latest.Load() }

// cooldownLeft returns how long up's cooldown for ex's credential lasts
// from now (0: none). With no cooldown in force it is one atomic load.
func (up *upstream) cooldownLeft(ex *exchange, now time.Time) time.Duration {
	if !up.cooldowns.possible(now) {
		return 0
	}
	return up.cooldowns.remaining(ex.credFor(up), now)
}

// remaining returns how long key's cooldown lasts from now (0: none).
func (c *cooldowns) remaining(key uint64, now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	u, ok := c.until[key]
	if !ok {
		return 0
	}
	if !u.After(now) {
		delete(c.until, key)
		return 0
	}
	return u.Sub(now)
}

// active counts the cooldowns in force and returns the latest end.
func (c *cooldowns) active(now time.Time) (n int, latest time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, u := range c.until {
		if u.After(now) {
			n++
			if u.After(latest) {
				latest = u
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
	slotTaken     slotResult = iota
	slotTimedOut             // none freed within the wait
	slotCancelled            // cancel or gone fired first
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
		return slotTaken
	case <-t.C:
		return slotTimedOut
	case <-cancel:
	case <-gone:
	}
	return slotCancelled
}

func (s slots) release() { <-s }
