package fleet

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The lease bounds. A limit is leased when a block of it can hold at
// least MinLease slots: its rate × LeaseShare and its burst both reach
// MinLease (a rate of 200/s and a burst of 20). A smaller limit — most
// per-client limits — keeps one Redis call per request.
const (
	// MaxLeases bounds the limits this replica holds leases of (pacing's,
	// each client key's); past it a limit not yet leased, and with no
	// lapsed lease to take the place of, takes one call per request.
	MaxLeases = 4096
	// LeaseFor is how long a block lasts: it lapses, with what it has
	// left, LeaseFor after the last renewal.
	LeaseFor = time.Second
	// LeaseShare is the most of a second's rate one block holds.
	LeaseShare = 0.1
	// MinLease is the fewest slots a block is worth taking.
	MinLease = 20
	// leaseAhead is how long a block is sized to last at this replica's
	// recent rate: renewed when half of it is spent, it outlasts the
	// renewal's round trip and never reaches LeaseFor.
	leaseAhead = 250 * time.Millisecond
	// leaseCalm is how long a renewal that took nothing (the fleet at its
	// limit, or Redis failing) holds off the next.
	leaseCalm = 100 * time.Millisecond
)

// leaseScript takes up to ARGV[3] slots of the GCRA limit in KEYS[1]
// (the key Reserve uses: both spend one budget) that are free now —
// within the burst, no wait — if at least ARGV[4] are; ARGV[1] is the
// emission interval (µs), ARGV[2] the burst. It returns how many it took
// (0: none).
var leaseScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local free = math.floor((now + tonumber(ARGV[2]) * interval - tat) / interval)
local n = math.min(tonumber(ARGV[3]), free)
if n < tonumber(ARGV[4]) then return 0 end
local new = tat + n * interval
redis.call('SET', KEYS[1], string.format('%.0f', new), 'PX', math.ceil((new - now) / 1000) + 1000)
return n`)

// lease is this replica's leased slots of one limit: spent here without
// a call, renewed in the background when half of a block is spent.
// Times are monotonic (mono): a wall-clock step neither extends nor ends
// a block.
type lease struct {
	left  atomic.Int64 // slots not yet spent
	until atomic.Int64 // mono: what is left lapses
	// done, under mu, is the one call taking a block (in the background,
	// or a request's own): closed when it ends, nil while none is in
	// flight; renewing mirrors it for the spending path's check.
	done     chan struct{}
	renewing atomic.Bool
	// taken counts this replica's requests of the limit since since
	// (mono), leased or not: its recent share sizes the next block.
	taken atomic.Int64
	since atomic.Int64
	size  atomic.Int64 // the last block's size
	// calm is when (mono) a block may next be asked for after a call that
	// took none: a fleet at its limit is not asked twice a request.
	calm atomic.Int64
	// rate (its bits) and burst are the limit's the lease was taken
	// under: a reload that changes them drops what is left (refit).
	rate  atomic.Uint64
	burst atomic.Int64
	mu    sync.Mutex // orders a block's arrival against a lapse and a refit
}

// monoStart anchors mono.
var monoStart = time.Now()

// mono is the monotonic clock, in nanoseconds since the process started.
func mono() int64 { return int64(time.Since(monoStart)) }

// leaseMap is a State's leases of one kind (a limit's slots: lease; a
// token budget's: tokenLease), by name; at most MaxLeases.
type leaseMap[L any] struct {
	mu sync.RWMutex
	m  map[string]*L
}

// lookup is name's lease (nil: none).
func (lm *leaseMap[L]) lookup(name string) *L {
	lm.mu.RLock()
	defer lm.mu.RUnlock()
	return lm.m[name]
}

// evictScan is how many leases a full map looks at for idle ones.
const evictScan = 16

// get returns name's lease, made by fresh on first use; nil when
// MaxLeases are held and none of the evictScan looked at is idle (those
// that are leave, under the write lock).
func (lm *leaseMap[L]) get(name string, idle func(*L) bool, fresh func() *L) *L {
	if l := lm.lookup(name); l != nil {
		return l
	}
	lm.mu.Lock()
	defer lm.mu.Unlock()
	if l := lm.m[name]; l != nil {
		return l
	}
	if lm.m == nil {
		lm.m = map[string]*L{}
	}
	if len(lm.m) >= MaxLeases {
		seen := 0
		for k, l := range lm.m {
			if seen++; seen > evictScan {
				break
			}
			if idle(l) {
				delete(lm.m, k)
			}
		}
		if len(lm.m) >= MaxLeases {
			return nil
		}
	}
	l := fresh()
	lm.m[name] = l
	return l
}

// all is the leases held now.
func (lm *leaseMap[L]) all() []*L {
	lm.mu.RLock()
	defer lm.mu.RUnlock()
	ls := make([]*L, 0, len(lm.m))
	for _, l := range lm.m {
		ls = append(ls, l)
	}
	return ls
}

// leaseSize is the largest block of a limit of rate per second and
// burst: 0 when it is too small to lease.
func leaseSize(rate float64, burst int) int64 {
	n := min(int64(math.Floor(rate*LeaseShare)), int64(burst))
	if n < MinLease {
		return 0
	}
	return n
}

// TakeLeased spends one slot of the fleet-wide limit name (rate per
// second, burst) from this replica's lease of it, and reports whether it
// did; false when the limit is too small to lease, MaxLeases are held, or
// no slot could be leased now (the fleet at its limit, Redis down) — the
// caller then reserves its slot with Reserve. A request that finds the
// lease spent or lapsed takes the next block itself, its own slot among
// them (one call, as Reserve would be), or waits for the renewal in
// flight: a background renewal never races it for the free slots. The
// next block is taken in the background once half of one is spent.
func (s *State) TakeLeased(name string, rate float64, burst int) bool {
	most := leaseSize(rate, burst)
	if most == 0 {
		return false
	}
	l := s.leaseOf(name)
	if l == nil {
		return false
	}
	l.refit(rate, burst)
	l.taken.Add(1)
	if now := mono(); l.spend(now) {
		if l.left.Load()*2 <= l.size.Load() && !l.renewing.Load() && now >= l.calm.Load() && s.Up() &&
			l.begin() == began {
			go s.renew(name, l, rate, burst, most, 0)
		}
		return true
	}
	switch l.begin() {
	case busy: // a block is on its way: this request's slot from it, or Reserve's
		l.wait(s.cfg.Timeout)
		return l.spend(mono())
	case refilled:
		return l.spend(mono())
	}
	if mono() < l.calm.Load() || !s.Usable() { // the fleet had no slot to lease a moment ago, or Redis is down
		l.end()
		return false
	}
	return s.renew(name, l, rate, burst, most, 1) // the next block, this request's slot in it
}

// What begin found: the renewal is the caller's (began), another is in
// flight (busy), or a block came since the caller looked (refilled).
const (
	began = iota
	busy
	refilled
)

// spend takes one slot of a block not lapsed at now; a lapsed block's
// remainder is dropped.
func (l *lease) spend(now int64) bool {
	if now >= l.until.Load() {
		if l.left.Load() > 0 {
			l.lapse(now)
		}
		return false
	}
	for v := l.left.Load(); v > 0; v = l.left.Load() {
		if l.left.CompareAndSwap(v, v-1) {
			return true
		}
	}
	return false
}

// begin takes the lease's one renewal if none is in flight and one is
// still needed (half a block or less left, or lapsed), all under mu: a
// request never finds the flag taken and the wait not yet readied.
func (l *lease) begin() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.done != nil:
		return busy
	case l.left.Load()*2 > l.size.Load() && mono() < l.until.Load():
		return refilled
	}
	l.done = make(chan struct{})
	l.renewing.Store(true)
	return began
}

// end gives the renewal back and wakes those waiting on it.
func (l *lease) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	close(l.done)
	l.done = nil
	l.renewing.Store(false)
}

// wait waits, at most d, for the renewal in flight, if any.
func (l *lease) wait(d time.Duration) {
	l.mu.Lock()
	done := l.done
	l.mu.Unlock()
	if done == nil {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// refit drops what is left of a lease taken under another rate or burst
// (a reload changed the limit): the old blocks' size does not carry.
func (l *lease) refit(rate float64, burst int) {
	bits := math.Float64bits(rate)
	if l.rate.Load() == bits && l.burst.Load() == int64(burst) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rate.Load() != bits || l.burst.Load() != int64(burst) {
		l.left.Store(0)
		l.size.Store(0)
		l.rate.Store(bits)
		l.burst.Store(int64(burst))
	}
}

// lapse drops what a lapsed lease has left: the fleet counted it spent
// when it was taken (an unused block is capacity lost for a second, never
// capacity gained).
func (l *lease) lapse(now int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now >= l.until.Load() {
		l.left.Store(0)
	}
}

// leaseOf returns name's lease, made on first use; nil when MaxLeases are
// held and none of the few looked at has lapsed.
func (s *State) leaseOf(name string) *lease {
	if l := s.leases.lookup(name); l != nil {
		return l
	}
	return s.leases.get(name, lapsed, func() *lease {
		l := &lease{}
		l.since.Store(mono())
		return l
	})
}

// lapsed reports whether l has lapsed and no renewal is on its way: it
// may leave the map.
func lapsed(l *lease) bool { return mono() >= l.until.Load() && !l.renewing.Load() }

// renew takes l's next block (the caller holds its renewal: begin):
// sized to last leaseAhead at this replica's recent share (at least
// MinLease, at most most, and never past 1.5 blocks held), good for
// LeaseFor from now. own is the slots of it the caller takes itself (a
// request that found the lease spent: 1, and then a block of one free
// slot will do); it reports whether they were taken.
func (s *State) renew(name string, l *lease, rate float64, burst int, most, own int64) bool {
	defer l.end()
	defer s.recovered("lease")
	now := mono()
	since := l.since.Swap(now)
	share := float64(l.taken.Swap(0)) / max(time.Duration(now-since).Seconds(), 0.1)
	want := min(max(int64(math.Ceil(share*leaseAhead.Seconds())), MinLease), most)
	want = min(want, most*3/2-max(l.left.Load(), 0)) + own
	least := int64(MinLease)
	if own > 0 {
		least = own
	}
	if want < least {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	interval := math.Max(1, 1e6/rate)
	n, err := leaseScript.Run(ctx, s.rdb, []string{s.cfg.Prefix + "limit:" + name}, interval, burst, want, least).Int64()
	s.result("lease", err)
	if err != nil || n < least {
		l.calm.Store(mono() + int64(leaseCalm))
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rate.Load() != math.Float64bits(rate) || l.burst.Load() != int64(burst) {
		// A reload changed the limit meanwhile: the block is not spent
		// under the new one, but the caller's own slot was counted.
		return own > 0
	}
	if mono() >= l.until.Load() {
		l.left.Store(0) // a lapsed remainder does not carry into the new block
	}
	l.left.Add(n - own)
	l.size.Store(n)
	l.until.Store(mono() + int64(LeaseFor))
	return true
}

// Leased reports the slots of name this replica holds unspent (0: none),
// for tests.
func (s *State) Leased(name string) int64 {
	if l := s.leases.lookup(name); l != nil && mono() < l.until.Load() {
		return max(l.left.Load(), 0)
	}
	return 0
}
