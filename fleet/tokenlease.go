package fleet

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Token budgets by lease. A fleet's token budget large enough to split
// (TokenLeaseShare of its minute reaches MinTokenLease: 200,000 tokens a
// minute) is reserved here from this replica's lease of it — tokens the
// budget's hash holds for the replica, its field "l<replica>" — without
// a call: a request's reservation and its settlement are the lease's
// own bookkeeping, and one call now and then (a renewal when half of what
// it holds free is reserved, a flush a second after the last) moves the
// settled spend into the window, holds what the replica's requests in
// flight reserved, and sizes what it holds free to a second of the
// replica's recent share. A lease's tokens count against the budget
// like any reservation, so the fleet's bound is the one without leases;
// what a lease costs is capacity: tokens one replica holds free that
// another cannot reserve (≤ TokenLeaseShare of the minute per replica),
// and a replica that stops without closing loses the spend it settled
// in its last second.

const (
	// TokenLeaseShare is the most of a budget's minute a lease holds free
	// (besides what its requests in flight reserved).
	TokenLeaseShare = 0.1
	// MinTokenLease is the fewest free tokens a lease is worth holding.
	MinTokenLease = 20_000
	// TokenLeaseFor is how long Redis keeps a lease's hold after its last
	// call: a replica that stopped gives its tokens back this long after.
	TokenLeaseFor = 10 * time.Second
	// tokenFlush is how soon, after the lease was last used, its settled
	// spend reaches the window (a lease renewed meanwhile moved it there),
	// and how long an unused lease keeps its free tokens: the flush after
	// one that found it unused gives them back.
	tokenFlush = time.Second
	// tokenLeaseAhead is how long what a lease holds free lasts at this
	// replica's recent share.
	tokenLeaseAhead = time.Second
)

// leaseTokens sets the caller's lease of the budget in KEYS[1] (ARGV: 1
// the limit, 2 the replica, 3 the spend settled since its last call — now
// the window's —, 4 floor, the tokens it must go on holding (its requests
// in flight), 5 need (≥ floor), 6 want (≥ need), 7 how long it holds, µs):
// want, or what room the budget has, if at least need fit; else floor.
// Returns {need met, wait µs as reserveTokens, remaining, held, reserved
// by requests in flight and leases}.
var leaseTokens = redis.NewScript(`local self = 'l' .. ARGV[2]` + tokenWindow + `
local spend, floor, need, want = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if spend > 0 then
  redis.call('HINCRBY', KEYS[1], 's' .. slot, spend)
  spent = spent + spend
  slots[#slots + 1] = {slot, spend}
end
local room, held, taken = limit - spent - reserved, floor, 0
if room >= need then held, taken = math.max(math.min(want, room), floor), 1 end
if held > 0 then
  redis.call('HSET', KEYS[1], self, string.format('%.0f:%.0f', held, now + tonumber(ARGV[7])))
else
  redis.call('HDEL', KEYS[1], self)
end
redis.call('PEXPIRE', KEYS[1], 360000)
local w = 0
if taken == 0 then w = wait(need) end
return {taken, w, limit - spent - reserved - held, held, reserved + held}`)

// tokenLeaseSize is the most a lease of a budget of limit tokens a
// minute holds free: 0 when the budget is too small to lease.
func tokenLeaseSize(limit int64) int64 {
	n := int64(float64(limit) * TokenLeaseShare)
	if n < MinTokenLease {
		return 0
	}
	return n
}

// tokenLease is this replica's lease of one fleet token budget. call
// orders its calls to Redis (one at a time), mu its books; call is
// taken before mu.
type tokenLease struct {
	st   *State
	name string
	call sync.Mutex
	mu   sync.Mutex
	// limit is the budget's as last reserved under: a change gives back
	// what is held free (a reload made it smaller, or larger).
	limit int64
	// held is what Redis holds for the lease as of its last call (0 once
	// lapsed: until, mono); inFlight what this replica's requests
	// reserved of it and have not settled; unflushed what settled
	// requests used, not yet in the window. What is free is held less
	// both.
	held, inFlight, unflushed int64
	until                     int64
	// size is what the lease aims to hold free; reserved counts the tokens
	// reserved since since (mono): its recent share.
	size, reserved, since int64
	// used says the lease was reserved from or settled since the last
	// flush; lastCall is when (mono) it last called; calm is when a
	// background renewal may next be tried after one that failed.
	used           bool
	lastCall, calm int64
	// renewing: a background renewal is on its way; shrinking: the call
	// in flight may leave less held than now, so nothing is reserved from
	// what is free meanwhile.
	renewing, shrinking bool
	flush               *time.Timer // armed while the lease holds or owes anything
}

// tokenAnswer is a budget's answer to a reservation (ReserveTokens').
type tokenAnswer struct {
	hold                TokenHold
	taken               bool
	wait                time.Duration
	remaining, reserved int64
}

// reserveLeased reserves n tokens of l (limit a minute): from what it
// holds free, else with a call that holds them too (its requests' books
// moved to the window in the same call); one call at a time — a request
// that waited for another's finds it may have brought enough.
func (l *tokenLease) reserveLeased(n, limit int64) (tokenAnswer, error) {
	l.mu.Lock()
	if l.take(n, limit) {
		renew := !l.renewing && l.free()*2 <= l.size && mono() >= l.calm && l.st.Up()
		l.renewing = l.renewing || renew
		l.mu.Unlock()
		if renew {
			go l.renewBackground()
		}
		return l.answer(n), nil
	}
	l.mu.Unlock()
	l.call.Lock()
	defer l.call.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.take(n, limit) {
		return l.answer(n), nil
	}
	// What is free is this request's now (no other takes it meanwhile):
	// the call holds the rest.
	f := max(l.free(), 0)
	l.inFlight += f
	r, err := l.exchange(n-f, false)
	if err != nil || !r.taken {
		l.inFlight -= f
		return r, err
	}
	l.reserved += f
	r.hold = l.answer(n).hold
	return r, nil
}

func (l *tokenLease) answer(n int64) tokenAnswer {
	return tokenAnswer{hold: TokenHold{Name: l.name, Reserved: n, lease: l}, taken: true}
}

// free is what l holds that nothing reserved or spent (under mu; < 0:
// its requests used more than they reserved).
func (l *tokenLease) free() int64 {
	if mono() >= l.until {
		l.held = 0 // lapsed: Redis dropped it, or soon will
	}
	return l.held - l.inFlight - l.unflushed
}

// take reserves n from what l holds free, if it can (under mu).
func (l *tokenLease) take(n, limit int64) bool {
	if limit != l.limit {
		l.limit, l.size = limit, 0
		l.held = min(l.held, l.inFlight+l.unflushed) // the next call gives the rest back
	}
	if l.shrinking || l.free() < n {
		return false
	}
	l.inFlight += n
	l.reserved += n
	l.mark()
	return true
}

// mark notes a use of l and arms its flush (under mu).
func (l *tokenLease) mark() {
	l.used = true
	if l.flush == nil {
		l.flush = time.AfterFunc(tokenFlush, l.flushNow)
	}
}

// settle turns a reservation of n into used tokens (0: a refund).
func (l *tokenLease) settle(n, used int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inFlight -= n
	l.unflushed += max(used, 0)
	l.mark()
}

// exchange is l's call to Redis (under call and mu; mu is let go during
// it): n more tokens for a request (0: a renewal or a flush), the spend
// settled so far into the window, what is held free sized anew — none
// when shrink (an unused lease's flush).
func (l *tokenLease) exchange(n int64, shrink bool) (tokenAnswer, error) {
	now := mono()
	l.free() // a lapsed hold is 0
	spend := l.unflushed
	floor := max(l.held-spend, l.inFlight) // what it reserved from the hold meanwhile stays held
	if shrink {
		floor = l.inFlight
	}
	want := l.inFlight + n
	if !shrink {
		want += l.resize(now)
	}
	need := floor + n
	want = max(want, need)
	l.shrinking = shrink
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), l.st.cfg.Timeout)
	r, err := leaseTokens.Run(ctx, l.st.rdb, []string{l.st.cfg.Prefix + "tokens:" + l.name}, l.limit, l.st.id, spend, floor, need,
		want, TokenLeaseFor.Microseconds()).Int64Slice()
	cancel()
	l.st.result("tokens", err)
	if err == nil && len(r) != 5 {
		err = redis.Nil
	}
	l.mu.Lock()
	l.shrinking = false
	if err != nil {
		l.calm = mono() + int64(leaseCalm)
		return tokenAnswer{}, err
	}
	l.unflushed -= spend
	l.held, l.until, l.lastCall = r[3], now+int64(TokenLeaseFor), now
	a := tokenAnswer{taken: r[0] == 1, wait: time.Duration(r[1]) * time.Microsecond, remaining: r[2], reserved: r[4]}
	if n > 0 && a.taken {
		l.inFlight += n
		l.reserved += n
		l.mark()
	}
	return a, nil
}

// resize sizes what l holds free from its recent share (under mu):
// tokenLeaseAhead of it, between MinTokenLease and tokenLeaseSize.
func (l *tokenLease) resize(now int64) int64 {
	elapsed := max(time.Duration(now-l.since).Seconds(), 0.1)
	share := float64(l.reserved) / elapsed
	l.reserved, l.since = 0, now
	l.size = min(max(int64(math.Ceil(share*tokenLeaseAhead.Seconds())), MinTokenLease), tokenLeaseSize(l.limit))
	return l.size
}

// renewBackground tops up what l holds free, off any request; it gives
// way to a request's own call in flight.
func (l *tokenLease) renewBackground() {
	if !l.call.TryLock() {
		l.mu.Lock()
		l.renewing = false
		l.mu.Unlock()
		return
	}
	defer l.call.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.renewing = false
	if l.free()*2 <= l.size {
		_, _ = l.exchange(0, false)
	}
}

// flushNow is l's flush: a second after a use, it moves the settled
// spend into the window (unless a call did that within the second),
// keeps what its requests in flight hold from lapsing, and — when l was
// not used since the flush before — gives what it holds free back. It
// rearms while l holds or owes anything.
func (l *tokenLease) flushNow() {
	l.call.Lock()
	defer l.call.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flush = nil
	if l.st.closed.Load() {
		return
	}
	unused := !l.used
	l.used = false
	switch {
	case l.held == 0 && l.inFlight == 0 && l.unflushed == 0:
		return
	case unused || mono()-l.lastCall >= int64(tokenFlush)/2:
		if l.st.Usable() {
			_, _ = l.exchange(0, unused)
		}
	}
	if l.held > 0 || l.inFlight > 0 || l.unflushed > 0 {
		l.flush = time.AfterFunc(tokenFlush, l.flushNow)
	}
}

// tokenLeases is the State's token leases, by budget name; at most
// MaxLeases.
type tokenLeases struct {
	mu sync.Mutex
	m  map[string]*tokenLease
}

// tokenLeaseOf returns name's lease, made on first use; nil when
// MaxLeases are held and none of the few looked at is idle.
func (s *State) tokenLeaseOf(name string) *tokenLease {
	s.tokenLeases.mu.Lock()
	defer s.tokenLeases.mu.Unlock()
	if l := s.tokenLeases.m[name]; l != nil {
		return l
	}
	if s.tokenLeases.m == nil {
		s.tokenLeases.m = map[string]*tokenLease{}
	}
	if len(s.tokenLeases.m) >= MaxLeases {
		seen := 0
		for k, l := range s.tokenLeases.m {
			if seen++; seen > evictScan {
				break
			}
			if l.idle() {
				delete(s.tokenLeases.m, k)
			}
		}
		if len(s.tokenLeases.m) >= MaxLeases {
			return nil
		}
	}
	l := &tokenLease{st: s, name: name, since: mono()}
	s.tokenLeases.m[name] = l
	return l
}

// idle reports whether l holds, owes and awaits nothing: it may leave
// the map.
func (l *tokenLease) idle() bool {
	if !l.mu.TryLock() {
		return false
	}
	defer l.mu.Unlock()
	return l.held == 0 && l.inFlight == 0 && l.unflushed == 0 && l.flush == nil && !l.renewing
}

// TokenLeased reports what this replica's lease of name holds, and what
// of that is free (for tests).
func (s *State) TokenLeased(name string) (held, free int64) {
	s.tokenLeases.mu.Lock()
	l := s.tokenLeases.m[name]
	s.tokenLeases.mu.Unlock()
	if l == nil {
		return 0, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.free()
	return l.held, f
}

// giveBackTokens moves, as the State closes, its token leases' settled
// spend into the window and gives back what they hold free (their
// requests in flight keep their holds, which lapse TokenLeaseFor later):
// no new call once the State's timeout has passed.
func (s *State) giveBackTokens() {
	s.tokenLeases.mu.Lock()
	ls := make([]*tokenLease, 0, len(s.tokenLeases.m))
	for _, l := range s.tokenLeases.m {
		ls = append(ls, l)
	}
	s.tokenLeases.mu.Unlock()
	end := time.Now().Add(s.cfg.Timeout)
	for _, l := range ls {
		if time.Now().After(end) || !s.Usable() {
			return
		}
		l.call.Lock()
		l.mu.Lock()
		if l.held > 0 || l.unflushed > 0 {
			_, _ = l.exchange(0, true)
		}
		l.mu.Unlock()
		l.call.Unlock()
	}
}
