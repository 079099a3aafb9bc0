package proxy

import (
	"fmt"
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

// clientLimiter is one `clients:` entry (or the limits client keys of
// the same settings share): a token bucket of requests per client, at
// most upstream.MaxTrackedKeys of them (the least recently used goes),
// and, when it sets token budgets, a keyBudget per client (tokens.go).
type clientLimiter struct {
	opts   ClientLimit
	header []byte
	// byCredential: keyed by the request's credential (Bearer, else
	// x-api-key), the default key_header's meaning; else by header's value.
	byCredential bool
	onEvict      func()
	mu           sync.Mutex
	buckets      *simplelru.LRU[uint64, *rate.Limiter]
	// budgets are the clients' token budgets (nil: the entry sets none),
	// under mu like the buckets; bySource counts those of clients not
	// authenticated, by their source (MaxBudgetsPerSource).
	budgets  *simplelru.LRU[uint64, *keyBudget]
	bySource map[uint64]int
	// fleetName starts its clients' limit names in the fleet (its
	// settings: clientLimitName), built once.
	fleetName string
}

// keyOf is the value that tells a request's client apart.
func (l *clientLimiter) keyOf(h *fasthttp.RequestHeader) []byte {
	if l.byCredential {
		id, _ := credential(h)
		return id
	}
	return h.PeekBytes(l.header)
}

func newClientLimiter(o ClientLimit, onEvict func()) *clientLimiter {
	buckets, _ := simplelru.NewLRU[uint64, *rate.Limiter](upstream.MaxTrackedKeys, nil) // cannot fail: the size is > 0
	l := &clientLimiter{opts: o, header: []byte(o.KeyHeader), byCredential: strings.EqualFold(o.KeyHeader, DefaultKeyHeader),
		onEvict: onEvict, buckets: buckets,
		fleetName: fmt.Sprintf("client:%s:%g:%d:", o.KeyHeader, o.RequestsPerSecond, o.Burst)}
	if o.TokenLimits.any() || o.Spend.USD > 0 {
		l.bySource = map[uint64]int{}
		l.budgets, _ = simplelru.NewLRU(upstream.MaxTrackedKeys, func(_ uint64, b *keyBudget) { l.forget(b) }) // cannot fail: the size is > 0
	}
	return l
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

// clientLimits is the clients: limits as a hook: each request takes one
// from every limit whose key it carries — its client key's own limit
// (client_keys_file) in place of the entries keyed by credential; a
// request once admitted is not given back (a limit of requests, not of
// their cost).
type clientLimits []*clientLimiter

// each calls f with every limit a request of ex is under, until one
// refuses it: its client key's own limit (who: "this key"), in place of
// the entries keyed by credential, and the other entries ("this
// client").
func (cls clientLimits) each(ex *exchange, f func(cl *clientLimiter, who string) *apiError) *apiError {
	own := ex.req.key != nil && ex.req.key.limit != nil
	if own {
		if e := f(ex.req.key.limit, "this key"); e != nil {
			return e
		}
	}
	for _, cl := range cls {
		if own && cl.byCredential {
			own = false // the key's own limit took the first such entry's place
			continue
		}
		if e := f(cl, "this client"); e != nil {
			return e
		}
	}
	return nil
}

// budgeted reports whether some entry sets a token budget.
func (cls clientLimits) budgeted() bool {
	for _, cl := range cls {
		if cl.budgets != nil {
			return true
		}
	}
	return false
}

// budgeted reports whether some key has a token budget of its own.
func (ks clientKeys) budgeted() bool {
	for _, k := range ks {
		if k.limit != nil && k.limit.budgets != nil {
			return true
		}
	}
	return false
}

// keepBudgets gives l the budgets of prev, an entry a reload changed,
// when both set some and tell clients apart the same way: what was spent
// and reserved stays, under l's limits (policy.TokenWindow.SetLimit).
func (l *clientLimiter) keepBudgets(prev *clientLimiter) {
	if l.budgets == nil || prev.budgets == nil || prev.opts.KeyHeader != l.opts.KeyHeader {
		return
	}
	prev.mu.Lock()
	defer prev.mu.Unlock()
	for _, h := range prev.budgets.Keys() { // the oldest first: the order stays
		b, _ := prev.budgets.Peek(h)
		l.adopt(h, b)
	}
}

// adopt makes b, a budget another limiter held for the client hashed h,
// l's, under l's limits.
func (l *clientLimiter) adopt(h uint64, b *keyBudget) {
	for k := range tokenKinds {
		b.w[k].SetLimit(l.opts.limit(k))
	}
	l.mu.Lock()
	if _, had := l.budgets.Peek(h); !had && b.src != 0 {
		l.bySource[b.src]++
	}
	l.budgets.Add(h, b)
	l.mu.Unlock()
}

// forget uncounts b from its source as it leaves budgets (the map's
// eviction hook, under mu).
func (l *clientLimiter) forget(b *keyBudget) {
	if b.src == 0 {
		return
	}
	if l.bySource[b.src]--; l.bySource[b.src] <= 0 {
		delete(l.bySource, b.src)
	}
}

// MaxBudgetsPerSource bounds the token budgets one source address (an
// IPv6 /64) holds for clients that are not authenticated: a credential
// costs nothing to invent without auth.keys, and one source must not
// fill the table every other client needs (upstream.MaxTrackedKeys).
const MaxBudgetsPerSource = 1000
