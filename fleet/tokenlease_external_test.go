//go:build external

package fleet

import (
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"sturdy/internal/redistest"
)

// budgetHash reads a token budget's hash: the spend its window holds,
// and how many leases hold tokens of it.
func budgetHash(t *testing.T, s *State, name string) (spent int64, leases int) {
	spent, _, leases = budgetFields(t, s, name)
	return spent, leases
}

// budgetFields reads a token budget's hash: the spend its window holds,
// what requests' reservations hold, and how many leases hold tokens of
// it (a lease's field holding none stays until its deadline).
func budgetFields(t *testing.T, s *State, name string) (spent, reserved int64, leases int) {
	t.Helper()
	h, err := s.rdb.HGetAll(context.Background(), "t:tokens:"+name).Result()
	if err != nil {
		t.Fatal(err)
	}
	for f, v := range h {
		n, _ := strconv.ParseInt(v, 10, 64)
		switch f[0] {
		case 's':
			spent += n
		case 'r':
			reserved += n
		case 'l':
			if !strings.HasPrefix(v, "0:") {
				leases++
			}
		}
	}
	return spent, reserved, leases
}

// settled waits (at most 5 s: two flushes) until the budget's window
// holds want and no lease holds any of it.
func settled(t *testing.T, s *State, name string, want int64) {
	t.Helper()
	spent, leases := budgetHash(t, s, name)
	for end := time.Now().Add(5 * time.Second); (spent != want || leases != 0) && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
		spent, leases = budgetHash(t, s, name)
	}
	if spent != want || leases != 0 {
		t.Fatalf("the window holds %d tokens (want %d) and %d leases hold some (want none)", spent, want, leases)
	}
}

// TestTokenLeasesShareOneBudget: two replicas reserving one leased
// budget from eight goroutines until it refuses them admit no more than
// its limit and most of it, with a call per ten reservations or fewer;
// a few seconds on, the window holds exactly what was settled and the
// leases have given back what they held.
func TestTokenLeasesShareOneBudget(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	replicas := []*State{start(t, r.URL, Hooks{}), start(t, r.URL, Hooks{})}
	const limit, n = 1_000_000, 2_000
	calls := r.ScriptCalls()
	var taken, reservations atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(10 * time.Second)
	for i := range 8 {
		wg.Go(func() {
			s := replicas[i%2]
			for refused := 0; refused < 3 && time.Now().Before(end); {
				h, ok, _, _, _, err := s.ReserveTokens("big", limit, n)
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					refused++
					continue
				}
				reservations.Add(1)
				taken.Add(n)
				s.SettleTokens(h, n)
			}
		})
	}
	wg.Wait()
	calls = r.ScriptCalls() - calls
	t.Logf("%d reservations (%d tokens), %d script calls", reservations.Load(), taken.Load(), calls)
	if got := taken.Load(); got > limit || got < limit*7/10 {
		t.Fatalf("the replicas reserved %d tokens of a %d budget, want at most all and at least 70 %%", got, limit)
	}
	if calls*10 > reservations.Load() {
		t.Fatalf("%d script calls for %d reservations, want at most one per ten", calls, reservations.Load())
	}
	settled(t, replicas[0], "big", taken.Load())
}

// TestATokenLeaseKeepsItsRequestsHolds: what a replica's request in
// flight reserved from its lease stays held — past the flush that gives
// the lease's free tokens back — so another replica cannot reserve it;
// a reply that used more than it reserved is spent in full.
func TestATokenLeaseKeepsItsRequestsHolds(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	a, b := start(t, r.URL, Hooks{}), start(t, r.URL, Hooks{})
	const limit = 1_000_000
	h, ok, _, _, _, err := a.ReserveTokens("held", limit, 90_000)
	if err != nil || !ok || h.lease == nil {
		t.Fatalf("a: taken %v (leased %v), %v", ok, h.lease != nil, err)
	}
	held, free := a.TokenLeased("held")
	for end := time.Now().Add(3*tokenFlush + 2*time.Second); free != 0 && time.Now().Before(end); { // unused: its free tokens go back
		time.Sleep(50 * time.Millisecond)
		held, free = a.TokenLeased("held")
	}
	if held != 90_000 || free != 0 {
		t.Fatalf("an unused lease holds %d (%d free), want its request's 90000 only", held, free)
	}
	var got int64
	for range 100 {
		hb, ok, _, remaining, _, err := b.ReserveTokens("held", limit, 10_000)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			if remaining < 0 || remaining >= 10_000 {
				t.Fatalf("b refused with %d remaining", remaining)
			}
			break
		}
		got += 10_000
		b.SettleTokens(hb, 10_000)
	}
	if got != limit-90_000 {
		t.Fatalf("b reserved %d, want the limit less a's request in flight (%d)", got, limit-90_000)
	}
	a.SettleTokens(h, 120_000)
	settled(t, a, "held", got+120_000)
}

// TestATokenBudgetTooSmallIsNotLeased: a budget whose tenth is under
// MinTokenLease — and a reservation larger than a lease holds free —
// takes a call each; a large budget's small reservations share calls.
func TestATokenBudgetTooSmallIsNotLeased(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	warm, err := New(Config{URL: r.URL, Prefix: "t:", Timeout: 200 * time.Millisecond}, zerolog.Nop(), Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	for _, limit := range []int64{100, 1_000_000} { // the three scripts loaded (a first call is two)
		h, _, _, _, _, err := warm.ReserveTokens("warm", limit, 1)
		if err == nil && h.lease == nil {
			err = warm.settleTokens(context.Background(), h, 0)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	warm.Close()
	s := start(t, r.URL, Hooks{}) // its first beat made
	for _, tt := range []struct {
		name         string
		limit, n     int64
		reservations int64
		mostCalls    int64
	}{
		{"small", 10*MinTokenLease - 1, 100, 20, 20},
		{"large-reservation", 1_000_000, 100_001, 5, 5},
		{"leased", 1_000_000, 100, 20, 2}, // its first call, and a flush if a loaded machine takes a second
	} {
		calls, settles := r.ScriptCalls(), int64(0)
		for range tt.reservations {
			h, ok, _, _, _, err := s.ReserveTokens(tt.name, tt.limit, tt.n)
			if err != nil || !ok {
				t.Fatalf("%s: %v %v", tt.name, ok, err)
			}
			if h.lease != nil {
				s.SettleTokens(h, 0) // the lease's books: no call
				continue
			}
			settles++
			if err := s.settleTokens(context.Background(), h, 0); err != nil { // a refund's call, counted apart
				t.Fatal(err)
			}
		}
		got := r.ScriptCalls() - calls - settles
		if tt.mostCalls == tt.reservations && got != tt.reservations || got > tt.mostCalls {
			t.Fatalf("%s: %d reservations made %d reserving calls, want %d at most (all, when not leased)", tt.name,
				tt.reservations, got, tt.mostCalls)
		}
	}
}

// TestAChangedTokenLimitGivesTheLeaseBack: a reservation under another
// limit (a reload) reserves anew, and what the lease held free under the
// old one is not spent under it.
func TestAChangedTokenLimitGivesTheLeaseBack(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	s := start(t, r.URL, Hooks{})
	if _, ok, _, _, _, err := s.ReserveTokens("reloaded", 2_000_000, 1_000); err != nil || !ok {
		t.Fatalf("%v %v", ok, err)
	}
	if _, free := s.TokenLeased("reloaded"); free < MinTokenLease-1_000 {
		t.Fatalf("the lease holds %d free, want at least a block", free)
	}
	calls := r.ScriptCalls()
	_, ok, _, _, _, err := s.ReserveTokens("reloaded", 1_000_000, 1_000)
	if err != nil || !ok || r.ScriptCalls() != calls+1 {
		t.Fatalf("under a new limit: taken %v (%v), %d calls, want one", ok, err, r.ScriptCalls()-calls)
	}
	if held, _ := s.TokenLeased("reloaded"); held > 2_000+tokenLeaseSize(1_000_000) {
		t.Fatalf("the lease holds %d, more than its requests and a block of the new limit", held)
	}
}

// TestAClosingReplicaGivesItsTokenLeaseBack: Close moves the spend a
// lease settled into the window and gives back what it held free at
// once — not a flush, nor TokenLeaseFor, later.
func TestAClosingReplicaGivesItsTokenLeaseBack(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	s, err := New(Config{URL: r.URL, Prefix: "t:", Timeout: 200 * time.Millisecond}, zerolog.Nop(), Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	h, ok, _, _, _, err := s.ReserveTokens("closing", 1_000_000, 5_000)
	if err != nil || !ok {
		t.Fatalf("%v %v", ok, err)
	}
	s.SettleTokens(h, 4_000)
	s.Close()
	check := start(t, r.URL, Hooks{})
	if spent, leases := budgetHash(t, check, "closing"); spent != 4_000 || leases != 0 {
		t.Fatalf("after Close the window holds %d (want 4000) and %d leases (want none)", spent, leases)
	}
}

// replyDropper is a loopback proxy to the Redis at addr whose replies
// are dropped while drop is set: a call that runs in Redis and whose
// reply never comes.
func replyDropper(t *testing.T, addr string) (url string, drop *atomic.Bool) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	drop = new(atomic.Bool)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() {
				defer c.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := up.Read(buf)
					if n > 0 && !drop.Load() {
						_, _ = c.Write(buf[:n])
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return "redis://" + ln.Addr().String() + "/0", drop
}

// TestALostReplyNeverLeavesALeaseOverBudget: a call that runs in Redis
// but whose reply is lost (an unused lease's flush, giving back what it
// holds free, with spend settled since the last call) leaves the lease
// believing no more than Redis holds for it, and its spend in the window
// once, not again with the next call — before, the lease went on
// spending what it had given back (two replicas reserved 1,021,000 of
// 1,000,000).
func TestALostReplyNeverLeavesALeaseOverBudget(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	url, drop := replyDropper(t, r.Addr)
	a, b := start(t, url, Hooks{}), start(t, r.URL, Hooks{})
	const limit = 1_000_000
	h, ok, _, _, _, err := a.ReserveTokens("lost", limit, 1_000)
	if err != nil || !ok {
		t.Fatalf("%v %v", ok, err)
	}
	a.SettleTokens(h, 700)
	l := a.tokenLeaseOf("lost")
	l.call.Lock()
	l.mu.Lock()
	drop.Store(true)
	_, err = l.exchange(0, true)
	drop.Store(false)
	believed := l.held
	l.mu.Unlock()
	l.call.Unlock()
	if err == nil {
		t.Fatal("the call was answered with its reply dropped")
	}
	f, err := b.rdb.HGet(context.Background(), "t:tokens:lost", "l"+l.id).Result()
	held, _ := strconv.ParseInt(strings.Split(f, ":")[0], 10, 64)
	if err != nil || believed > held {
		t.Fatalf("the lease believes it holds %d, Redis holds %d (%q, %v)", believed, held, f, err)
	}
	if spent, _ := budgetHash(t, b, "lost"); spent != 700 {
		t.Fatalf("the lost call put %d in the window, want its 700", spent)
	}
	var got int64
	for _, s := range []*State{b, a} {
		for range 200 {
			h, ok, _, _, _, err := s.ReserveTokens("lost", limit, 10_000)
			if err != nil || !ok {
				break
			}
			got += 10_000
			s.SettleTokens(h, 10_000)
		}
	}
	if got > limit-700 {
		t.Fatalf("the replicas reserved %d of the %d a %d budget had left", got, limit-700, limit)
	}
	if spent, _ := budgetHash(t, b, "lost"); spent > 700+got {
		t.Fatalf("the window holds %d, more than the 700 and %d spent: the lost call's spend counted again", spent, got)
	}
}

// TestALeaseHoldsFreeNoMoreThanItsShare: tokens a lease's requests gave
// back (refunds, estimates over what was used) do not stay held while
// the lease is used lightly — each call sizes what is free to the
// replica's recent share (here, below MinTokenLease: that much).
func TestALeaseHoldsFreeNoMoreThanItsShare(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	s := start(t, r.URL, Hooks{})
	const limit = 1_000_000
	var hs []TokenHold
	for range 60 {
		h, ok, _, _, _, err := s.ReserveTokens("share", limit, 2_000)
		if err != nil || !ok {
			t.Fatalf("%v %v", ok, err)
		}
		hs = append(hs, h)
	}
	for _, h := range hs {
		s.SettleTokens(h, 0)
	}
	_, free := s.TokenLeased("share")
	for end := time.Now().Add(3*tokenFlush + 2*time.Second); free > MinTokenLease && time.Now().Before(end); {
		if h, ok, _, _, _, err := s.ReserveTokens("share", limit, 100); err == nil && ok { // light use: 500 a second
			s.SettleTokens(h, 100)
		}
		time.Sleep(200 * time.Millisecond)
		_, free = s.TokenLeased("share")
	}
	if free > MinTokenLease {
		t.Fatalf("a lightly used lease holds %d free, want at most %d", free, MinTokenLease)
	}
}

// TestAClosingReplicasRequestsKeepTheirHolds: a State that closes with a
// request in flight turns what it reserved into a reservation the budget
// keeps (not a lease that lapses in TokenLeaseFor), and the request
// settling through the State that replaced it releases it and spends
// what it used; one that settled through it before the old one closed
// is not made a reservation no one releases; and concurrent reloads of
// the limit race no lease.
func TestAClosingReplicasRequestsKeepTheirHolds(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	old, err := New(Config{URL: r.URL, Prefix: "t:", Timeout: 200 * time.Millisecond}, zerolog.Nop(), Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 4 { // limits changing under the lease's calls (-race watches)
		wg.Go(func() {
			for range 25 {
				if h, ok, _, _, _, _ := old.ReserveTokens("closing", int64(1_000_000*(1+i%2)), 30_000); ok {
					old.SettleTokens(h, 0)
				}
			}
		})
	}
	wg.Wait()
	h, ok, _, _, _, err := old.ReserveTokens("closing", 1_000_000, 40_000)
	early, ok2, _, _, _, err2 := old.ReserveTokens("closing", 1_000_000, 20_000)
	if err != nil || err2 != nil || !ok || !ok2 || h.lease == nil {
		t.Fatalf("%v %v %v %v", ok, err, ok2, err2)
	}
	next := start(t, r.URL, Hooks{})
	next.SettleTokens(early, 5_000) // a reload made next the link; old's Close is on its way
	old.Close()
	reserved := func() (n int64, leases int) {
		_, n, leases = budgetFields(t, next, "closing")
		return n, leases
	}
	if n, leases := reserved(); n != 40_000 || leases != 0 {
		t.Fatalf("after Close the budget holds %d reserved (want the request's 40000) and %d leases (want none)", n, leases)
	}
	next.SettleTokens(h, 35_000)
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if n, _ := reserved(); n == 0 {
			break
		}
	}
	if n, _ := reserved(); n != 0 {
		t.Fatalf("settled through the next State, %d stay reserved", n)
	}
	if spent, _ := budgetHash(t, next, "closing"); spent != 40_000 {
		t.Fatalf("the window holds %d, want the 5000 and 35000 used", spent)
	}
}

// TestAStaleLeaseCallChangesNothing: a lease's call that reaches Redis
// after a later one of the same lease (its reply was lost, it was held up
// on the way) is refused whole — it cannot take back what the later call
// left held (two replicas reserved 1,050,000 of 1,000,000 when it could).
func TestAStaleLeaseCallChangesNothing(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	s := start(t, r.URL, Hooks{})
	if _, ok, _, _, _, err := s.ReserveTokens("stale", 1_000_000, 1_000); err != nil || !ok {
		t.Fatalf("%v %v", ok, err)
	}
	l := s.tokenLeaseOf("stale")
	field := func() string {
		v, err := s.rdb.HGet(context.Background(), "t:tokens:stale", "l"+l.id).Result()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	l.call.Lock() // no flush of its own meanwhile
	defer l.call.Unlock()
	before := field()
	l.mu.Lock()
	seq, flushed := l.seq, l.flushed
	l.mu.Unlock()
	for _, stale := range []int64{seq, seq - 1} { // an ending shrink, as a lost one would be
		got, err := leaseTokens.Run(context.Background(), s.rdb, []string{"t:tokens:stale"}, 1_000_000, l.id, flushed, 0, 0, 0,
			TokenLeaseFor.Microseconds(), 1, stale, flushed+500).Int64Slice()
		if err != nil || got[0] != -1 || field() != before {
			t.Fatalf("a stale call (%d, the lease's last %d): %v %v, the field %q → %q", stale, seq, got, err, before, field())
		}
	}
	if spent, _ := budgetHash(t, s, "stale"); spent != 0 {
		t.Fatalf("a stale call's spend counted: %d", spent)
	}
}

// TestRequestsQueuedBehindAHungRedisWaitOneTimeout: requests that find a
// lease empty while Redis does not answer queue for the lease's one call,
// and when it fails they take its answer — together about one timeout,
// not one each (eight: 1.6 s before).
func TestRequestsQueuedBehindAHungRedisWaitOneTimeout(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	s := start(t, r.URL, Hooks{}) // a 200 ms timeout
	pause := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer pause.Close()
	if err := pause.Do(context.Background(), "CLIENT", "PAUSE", 3000, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 8 {
		wg.Go(func() {
			if _, _, _, _, _, err := s.ReserveTokens("hung", 1_000_000, 1_000); err != nil {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	if took := time.Since(began); failed.Load() != 8 || took > 1200*time.Millisecond {
		t.Fatalf("%d of 8 failed, in %v (want all, in about one 200 ms timeout)", failed.Load(), took)
	}
}
