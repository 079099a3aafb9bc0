package proxy

import (
	"hash/maphash"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"

	"sturdy/upstream"
)

// credSeed keys the hashes of client credentials for this process's own
// client buckets: they are keyed by a hash of a header value, never the
// value itself. (Cooldowns, which the fleet shares, use fleet.Digest: the
// same in every process.)
var credSeed = maphash.MakeSeed()

// credHash hashes a credential (an Authorization value, a client key).
func credHash(v []byte) uint64 { return maphash.Bytes(credSeed, v) }

// clientLimiter is one `clients:` entry: a token bucket per client, at
// most upstream.MaxTrackedKeys of them (the least recently used goes).
type clientLimiter struct {
	opts   ClientLimit
	header []byte
	// byCredential: keyed by the request's credential (Bearer, else
	// x-api-key), the default key_header's meaning; else by header's value.
	byCredential bool
	onEvict      func()
	mu           sync.Mutex
	buckets      *simplelru.LRU[uint64, *rate.Limiter]
}

// keyOf is the value that tells a request's client apart.
func (l *clientLimiter) keyOf(h *fasthttp.RequestHeader) []byte {
	if l.byCredential {
		value, _ := credential(h)
		return value
	}
	return h.PeekBytes(l.header)
}

func newClientLimiter(o ClientLimit, onEvict func()) *clientLimiter {
	buckets, _ := simplelru.NewLRU[uint64, *rate.Limiter](upstream.MaxTrackedKeys, nil) // cannot fail: the size is > 0
	return &clientLimiter{opts: o, header: []byte(o.KeyHeader), byCredential: strings.EqualFold(o.KeyHeader, DefaultKeyHeader),
		onEvict: onEvict, buckets: buckets}
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
