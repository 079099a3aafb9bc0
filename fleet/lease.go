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
type lease struct {
	left     atomic.Int64 // slots not yet spent
	until    atomic.Int64 // UnixNano: what is left lapses
	renewing atomic.Bool  // one renewal in flight at most
	// taken counts this replica's requests of the limit since since
	// (UnixNano), leased or not: its recent share sizes the next block.
	taken atomic.Int64
	since atomic.Int64
	size  atomic.Int64 // the last block's size
	// calm is when (UnixNano) a renewal may next be tried after one that
	// took nothing: a fleet at its limit is not asked twice a request.
	calm atomic.Int64
	mu   sync.Mutex // orders a renewal's block against a lapse
}

// leases is the State's leases, by limit name; at most MaxLeases.
type leases struct {
	mu sync.RWMutex
	m  map[string]*lease
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
// second, burst) from this replica's lease of it, without a call; false
// when it holds none (the limit is too small to lease, the lease is
// spent or lapsed, or MaxLeases are held) — the caller reserves the slot
// with Reserve. Either way it counts the request toward this replica's
// share, and starts a renewal when the lease is half spent or empty.
func (s *State) TakeLeased(name string, rate float64, burst int) bool {
	most := leaseSize(rate, burst)
	if most == 0 {
		return false
	}
	l := s.leaseOf(name)
	if l == nil {
		return false
	}
	l.taken.Add(1)
	now := time.Now().UnixNano()
	ok := false
	if now < l.until.Load() {
		for v := l.left.Load(); v > 0; v = l.left.Load() {
			if l.left.CompareAndSwap(v, v-1) {
				ok = true
				break
			}
		}
	} else if l.left.Load() > 0 {
		l.lapse(now)
	}
	if l.left.Load()*2 <= l.size.Load() && now >= l.calm.Load() && s.Usable() && l.renewing.CompareAndSwap(false, true) {
		go s.renew(name, l, rate, burst, most)
	}
	return ok
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
	s.leases.mu.RLock()
	l := s.leases.m[name]
	s.leases.mu.RUnlock()
	if l != nil {
		return l
	}
	s.leases.mu.Lock()
	defer s.leases.mu.Unlock()
	if l = s.leases.m[name]; l != nil {
		return l
	}
	if s.leases.m == nil {
		s.leases.m = map[string]*lease{}
	}
	if len(s.leases.m) >= MaxLeases {
		s.evictLapsed(time.Now().UnixNano())
		if len(s.leases.m) >= MaxLeases {
			return nil
		}
	}
	l = &lease{}
	l.since.Store(time.Now().UnixNano())
	s.leases.m[name] = l
	return l
}

// evictScan is how many leases a full map looks at for a lapsed one.
const evictScan = 16

// evictLapsed drops up to evictScan lapsed, idle leases (under the
// write lock).
func (s *State) evictLapsed(now int64) {
	seen := 0
	for name, l := range s.leases.m {
		if seen++; seen > evictScan {
			return
		}
		if now >= l.until.Load() && !l.renewing.Load() {
			delete(s.leases.m, name)
		}
	}
}

// renew takes l's next block in the background: sized to last leaseAhead
// at this replica's recent share (at least MinLease, at most most), added
// to what is left, and good for LeaseFor from now.
func (s *State) renew(name string, l *lease, rate float64, burst int, most int64) {
	defer l.renewing.Store(false)
	now := time.Now()
	since := l.since.Swap(now.UnixNano())
	share := float64(l.taken.Swap(0)) / max(now.Sub(time.Unix(0, since)).Seconds(), 0.1)
	want := min(max(int64(math.Ceil(share*leaseAhead.Seconds())), MinLease), most)
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	interval := math.Max(1, 1e6/rate)
	n, err := leaseScript.Run(ctx, s.rdb, []string{s.cfg.Prefix + "limit:" + name}, interval, burst, want, MinLease).Int64()
	s.result("lease", err)
	if err != nil || n <= 0 {
		l.calm.Store(time.Now().Add(leaseCalm).UnixNano())
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if time.Now().UnixNano() >= l.until.Load() {
		l.left.Store(0) // a lapsed remainder does not carry into the new block
	}
	l.left.Add(n)
	l.size.Store(n)
	l.until.Store(time.Now().Add(LeaseFor).UnixNano())
}

// Leased reports the slots of name this replica holds unspent (0: none),
// for tests and /debug.
func (s *State) Leased(name string) int64 {
	s.leases.mu.RLock()
	defer s.leases.mu.RUnlock()
	if l := s.leases.m[name]; l != nil && time.Now().UnixNano() < l.until.Load() {
		return max(l.left.Load(), 0)
	}
	return 0
}
