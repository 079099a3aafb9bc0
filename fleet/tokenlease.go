package fleet

import (
	"context"
	"errors"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Token budgets by lease. A fleet's token budget large enough to split
// (TokenLeaseShare of its minute reaches MinTokenLease: 200,000 tokens a
// minute) is reserved here from this replica's lease of it — tokens the
// budget's hash holds for the lease, its field "l<lease>" — without a
// call: a request's reservation and its settlement are the lease's own
// books, and one call now and then (a renewal when what it holds free
// falls to half its size, a flush a second after a use) moves the
// settled spend into the window, holds what the replica's requests in
// flight reserved, and sizes what it holds free to a second of the
// replica's recent share. The lease never counts on more than Redis is
// sure to hold for it (what is free beyond the new size is given back
// before the call; a call that failed leaves the less of before and
// after; its calls are numbered, and one that reaches Redis after a
// later one changes nothing), and a call never makes Redis hold more for
// it than it held unless the budget has room. So a lease's tokens count against the
// budget like any reservation, and the fleet's bound is the one without
// leases; what a lease costs is capacity — tokens one replica holds free
// that another cannot reserve (≤ TokenLeaseShare of the minute per
// replica) — and a replica that dies without closing (Close ends its
// leases: end) loses the spend it settled since its last call, one cut
// off from Redis past TokenLeaseFor its holds there.

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
// the limit, 2 the lease, 3 and 10 the spend it knows it has put in the
// window and the spend settled so far — the difference, less what a call
// whose reply was lost put there, goes in now —, 4 floor, what its
// requests in flight reserved (what it holds of that is kept whatever the
// room; no more than it holds), 5 the more a request needs, 6 want (what
// it asks to hold), 7 how long it holds, µs, 8 "1" to end the lease —
// what it holds of floor becoming a reservation of this minute —, 9 the
// call's number, which must be past the lease's last: a call that
// reaches Redis after a later one does nothing). It holds want, or what
// room the budget has, when floor and the more fit; else floor as far as
// it holds it or room allows. The field stays (holding 0 once nothing is
// held, its number and spend with it) until its deadline. Returns {the
// more met (-1: a stale call), wait µs as reserveTokens, remaining, held
// (ending: what became a reservation), reserved by requests in flight and
// leases (ending: the minute)}.
var leaseTokens = redis.NewScript(`local self = 'l' .. ARGV[2]` + tokenWindow + `
if tonumber(ARGV[9]) <= ownSeq then return {-1, 0, 0, own, 0} end
local floor, more, want, total = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[10])
local keep, spend = math.min(floor, own), total - math.max(tonumber(ARGV[3]), ownFlushed)
if spend > 0 then
  redis.call('HINCRBY', KEYS[1], 's' .. slot, spend)
  spent = spent + spend
  slots[#slots + 1] = {slot, spend}
end
redis.call('PEXPIRE', KEYS[1], 360000)
local function hold(n)
  redis.call('HSET', KEYS[1], self, string.format('%.0f:%.0f:', n, now + tonumber(ARGV[7])) .. ARGV[9] .. ':' .. ARGV[10])
end
if ARGV[8] == '1' then
  hold(0)
  if keep > 0 then redis.call('HINCRBY', KEYS[1], 'r' .. minute, keep) end
  return {1, 0, limit - spent - reserved - keep, keep, minute}
end
local need = floor + more
local room, held, taken = limit - spent - reserved, math.max(keep, math.min(floor, limit - spent - reserved)), 0
if room >= need then held, taken = math.max(math.min(want, room), need), 1 end
hold(held)
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
	// id names its field ("l<id>"): the State's and the lease's own
	// number, so a lease evicted while a request still used it, and the
	// one made after it, never write one field.
	id   string
	call sync.Mutex
	mu   sync.Mutex
	// limit is the budget's as last reserved under: a change gives back
	// what is held free (a reload made it smaller, or larger).
	limit int64
	// held is what Redis holds for the lease, as far as is known — never
	// more: after a call that failed, the less of before and what it
	// asked for; 0 once lapsed (until, mono); inFlight what this replica's
	// requests reserved of it and have not settled; unflushed what settled
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
	// calling: a call is in flight (mu let go); renewing: a background
	// renewal is on its way.
	calling, renewing bool
	flush             *time.Timer // armed while the lease holds or owes anything
	// failed is the last call's error (nil: it answered).
	failed error
	// seq numbers its calls (the script's ARGV[9]); flushed is the spend
	// its calls are known to have put in the window (ARGV[3]).
	seq, flushed int64
	// closing is set as its State ends it (end): nothing is reserved from
	// it, settled into it or called for it after. ended is then the minute
	// (+1) what its requests in flight reserved became a reservation of,
	// moved how much of that is left to release: they settle it through
	// the State that replaced this one (detached); ended 0: not.
	closing      bool
	ended, moved int64
}

// errLeaseEnded is the answer to a reservation that reached a lease its
// State was ending: as for a State that cannot reach Redis, the caller
// decides (on_failure).
var errLeaseEnded = errors.New("the fleet's connection is closing")

// leaseSeq numbers the leases (tokenLease.id).
var leaseSeq atomic.Int64

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
		renew := !l.renewing && !l.calling && l.free()*2 <= l.size && mono() >= l.calm && l.st.Up()
		l.renewing = l.renewing || renew
		l.mu.Unlock()
		if renew {
			go l.renewBackground()
		}
		return l.answer(n), nil
	}
	l.mu.Unlock()
	queued, waited := time.Now(), !l.call.TryLock()
	if waited {
		l.call.Lock()
	}
	defer l.call.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.take(n, limit) {
		return l.answer(n), nil
	}
	if l.ending() {
		return tokenAnswer{}, errLeaseEnded
	}
	switch {
	case waited && l.failed != nil && !l.st.Up():
		// The call it waited for failed, and Redis is down: its answer
		// is this one's — requests queued behind a hung Redis wait one
		// timeout, not one each.
		return tokenAnswer{}, l.failed
	case waited && time.Since(queued) >= l.st.cfg.Timeout:
		return tokenAnswer{}, context.DeadlineExceeded // it waited its timeout for the calls before it
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

// ending reports whether l's State is closing (under mu).
func (l *tokenLease) ending() bool { return l.closing || l.st.closed.Load() }

// take reserves n from what l holds free, if it can (under mu).
func (l *tokenLease) take(n, limit int64) bool {
	if l.ending() {
		return false
	}
	if limit != l.limit {
		l.limit, l.size = limit, 0
		l.held = min(l.held, l.inFlight+l.unflushed) // the next call gives the rest back
	}
	if l.free() < n {
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

// settle turns a reservation of n into used tokens (0: a refund) in l's
// books, unless its State is closing (false: detached settles it).
func (l *tokenLease) settle(n, used int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ending() {
		return false
	}
	l.inFlight -= n
	l.unflushed += max(used, 0)
	l.mark()
	return true
}

// detached is how a hold of l settles once l's State is closing (through
// it, or the State that replaced it): the part of the reservation l's end
// made of its requests' tokens that is left, and its spend; before the
// end, or when it failed, its spend only — and l no longer counts it
// among its requests in flight, so its end does not make it a
// reservation no one releases.
func (l *tokenLease) detached(h TokenHold) TokenHold {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended == 0 {
		l.inFlight -= h.Reserved
		return TokenHold{Name: h.Name}
	}
	r := min(h.Reserved, l.moved)
	l.moved -= r
	return TokenHold{Name: h.Name, Minute: l.ended - 1, Reserved: r}
}

// exchange is l's call to Redis (under call and mu; mu is let go during
// it): more tokens for a request (0: a renewal or a flush), the spend
// settled so far into the window, and what is held free sized anew to
// the recent share — none when shrink (an unused lease's flush). What is
// free beyond the new size is given back before the call (no request
// takes it meanwhile), so the floor the call keeps is held in Redis
// already.
func (l *tokenLease) exchange(more int64, shrink bool) (tokenAnswer, error) {
	now := mono()
	size := int64(0)
	if !shrink {
		size = l.resize(now)
	}
	if f := l.free(); f > size {
		l.held -= f - size
	}
	spend, limit := l.unflushed, l.limit
	floor := max(l.held-spend, l.inFlight)
	want := l.inFlight + more + size
	l.calling = true
	l.seq++
	seq := l.seq
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), l.st.cfg.Timeout)
	acked := l.flushed
	r, err := leaseTokens.Run(ctx, l.st.rdb, []string{l.st.cfg.Prefix + "tokens:" + l.name}, limit, l.id, acked, floor, more,
		want, TokenLeaseFor.Microseconds(), 0, seq, acked+spend).Int64Slice()
	cancel()
	l.st.result("tokens", err)
	if err == nil && (len(r) != 5 || r[0] < 0) {
		err = redis.Nil
	}
	l.mu.Lock()
	l.calling = false
	l.failed = err
	if err != nil {
		// Redis holds what it held, or what the call set: at least the
		// less of the two. The spend goes with the next call (the script
		// counts what this one put in the window, if it did, once).
		l.held = min(l.held, floor)
		l.calm = mono() + int64(leaseCalm)
		return tokenAnswer{}, err
	}
	l.unflushed -= spend
	l.flushed += spend
	l.held, l.until, l.lastCall = r[3], now+int64(TokenLeaseFor), now
	if l.limit != limit { // a reload changed the limit meanwhile: nothing free is kept under the new one
		l.held = min(l.held, l.inFlight+l.unflushed+more)
	}
	a := tokenAnswer{taken: r[0] == 1, wait: time.Duration(r[1]) * time.Microsecond, remaining: r[2], reserved: r[4]}
	if more > 0 && a.taken {
		l.inFlight += more
		l.reserved += more
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
	defer l.st.recovered("tokens")
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
	if !l.ending() && l.free()*2 <= l.size {
		_, _ = l.exchange(0, false)
	}
}

// flushNow is l's flush: a second after a use, it moves the settled
// spend into the window (unless a call did that within half a second),
// sizes what is held free to the recent share, keeps what its requests
// in flight hold from lapsing, and — when l was not used since the flush
// before — gives what it holds free back. It rearms while l holds or
// owes anything.
func (l *tokenLease) flushNow() {
	l.call.Lock()
	defer l.call.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flush = nil
	if l.ending() {
		return
	}
	unused := !l.used
	l.used = false
	l.free() // a lapsed hold is 0
	switch {
	case l.held == 0 && l.inFlight == 0 && l.unflushed == 0:
		return
	case unused || mono()-l.lastCall >= int64(tokenFlush)/2:
		if l.st.Usable() {
			_, _ = l.exchange(0, unused)
		}
	}
	if (l.held > 0 || l.inFlight > 0 || l.unflushed > 0) && l.flush == nil { // a use during the call may have armed one
		l.flush = time.AfterFunc(tokenFlush, l.flushNow)
	}
}

// end ends l as its State closes: its settled spend goes into the window,
// what it holds free goes back, and what it holds of what its requests in
// flight reserved becomes a reservation of this minute, which they
// release as they settle, through this State or the one that replaces it
// (detached). Under call and mu; after it, l takes no reservation,
// settlement or call.
func (l *tokenLease) end() {
	l.closing = true
	l.free()
	spend := l.unflushed
	if l.held == 0 && spend == 0 {
		return
	}
	l.seq++
	ctx, cancel := context.WithTimeout(context.Background(), l.st.cfg.Timeout)
	defer cancel()
	r, err := leaseTokens.Run(ctx, l.st.rdb, []string{l.st.cfg.Prefix + "tokens:" + l.name}, l.limit, l.id, l.flushed,
		l.inFlight, 0, 0, 0, 1, l.seq, l.flushed+spend).Int64Slice()
	if err != nil || len(r) != 5 || r[0] < 0 {
		return // it lapses, TokenLeaseFor after its last call; its requests settle their spend only
	}
	l.unflushed -= spend
	l.flushed += spend
	l.held, l.ended, l.moved = 0, r[4]+1, r[3]
}

// tokenLeaseOf returns name's lease, made on first use; nil when
// MaxLeases are held and none of the few looked at is idle.
func (s *State) tokenLeaseOf(name string) *tokenLease {
	if l := s.tokenLeases.lookup(name); l != nil {
		return l
	}
	return s.tokenLeases.get(name, (*tokenLease).idle, func() *tokenLease {
		return &tokenLease{st: s, name: name, since: mono(), id: s.id + "." + strconv.FormatInt(leaseSeq.Add(1), 36)}
	})
}

// idle reports whether l holds, owes and awaits nothing: it may leave
// the map (a request that still reserves from it has a field of its own).
func (l *tokenLease) idle() bool {
	if !l.mu.TryLock() {
		return false
	}
	defer l.mu.Unlock()
	return l.free() == 0 && l.held == 0 && l.inFlight == 0 && l.unflushed == 0 && l.flush == nil && !l.renewing && !l.calling
}

// TokenLeased reports what this replica's lease of name holds, and what
// of that is free (for tests).
func (s *State) TokenLeased(name string) (held, free int64) {
	l := s.tokenLeases.lookup(name)
	if l == nil {
		return 0, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.free()
	return l.held, f
}

// giveBackTokens ends, as the State closes, each of its token leases
// (tokenLease.end): no new call once max(timeout, 1 s) has passed — those
// lapse, TokenLeaseFor after their last call, and the spend they settled
// since is lost.
func (s *State) giveBackTokens() {
	ls := s.tokenLeases.all()
	end := time.Now().Add(max(s.cfg.Timeout, time.Second))
	for _, l := range ls {
		if time.Now().After(end) {
			return
		}
		l.call.Lock()
		l.mu.Lock()
		l.end()
		l.mu.Unlock()
		l.call.Unlock()
	}
}
