//go:build external

package fleet

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sturdy/internal/redistest"
)

// take is a request's slot of the limit as the proxy takes it: leased,
// else reserved in Redis (no wait).
func take(t *testing.T, s *State, name string, rate float64, burst int) bool {
	if s.TakeLeased(name, rate, burst) {
		return true
	}
	_, taken, err := s.Reserve(name, rate, burst, 0)
	if err != nil {
		t.Error(err)
	}
	return taken
}

// TestLeasesShareOneLimit: two replicas taking one fleet-wide limit
// through leases. Not binding, they make at most one Redis call per ten
// requests; binding, the two together admit no more than the limit's
// rate and burst plus the slots two replicas can hold leased (each at
// most a block and a half: a renewal comes when half is spent).
func TestLeasesShareOneLimit(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	a, b := start(t, r.URL, Hooks{}), start(t, r.URL, Hooks{})
	run := func(name string, rate float64, burst int, each int, pause time.Duration) (admitted int64, took time.Duration) {
		var n atomic.Int64
		var wg sync.WaitGroup
		began := time.Now()
		for _, s := range []*State{a, b, a, b} {
			wg.Go(func() {
				for range each {
					if take(t, s, name, rate, burst) {
						n.Add(1)
					}
					time.Sleep(pause)
				}
			})
		}
		wg.Wait()
		return n.Load(), time.Since(began)
	}

	calls := r.ScriptCalls()
	admitted, _ := run("free", 1e6, 100_000, 2500, 0)
	calls = r.ScriptCalls() - calls
	if admitted != 4*2500 || calls*10 > admitted {
		t.Fatalf("a limit that never binds: %d of %d admitted with %d Redis calls (want all, ≤ 1 call per 10)", admitted, 4*2500, calls)
	}
	t.Logf("not binding: %d requests, %d Redis calls", admitted, calls)

	// Binding: the window measured starts once both replicas hold leases
	// (the GCRA alone would bound a window that starts on a fresh key),
	// and a sampler holds each replica to 1.5 blocks leased throughout.
	const rate, burst = 1000.0, 100
	most := leaseSize(rate, burst)
	stop := make(chan struct{})
	var over atomic.Int64
	var sampled sync.WaitGroup
	sampled.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			for _, s := range []*State{a, b} {
				if n := s.Leased("bound"); float64(n) > 1.5*float64(most) {
					over.Store(n)
				}
			}
		}
	})
	run("bound", rate, burst, 300, 500*time.Microsecond) // warm up
	admitted, took := run("bound", rate, burst, 1500, 500*time.Microsecond)
	close(stop)
	sampled.Wait()
	if n := over.Load(); n > 0 {
		t.Fatalf("a replica held %d slots leased; at most 1.5 blocks of %d", n, most)
	}
	bound := rate*took.Seconds() + burst + 2*1.5*float64(most)
	if float64(admitted) > bound || float64(admitted) < 0.5*rate*took.Seconds() {
		t.Fatalf("binding: %d admitted in %v; want ≤ %.0f (rate × time + burst + leases) and ≥ 0.5 × rate × time", admitted, took, bound)
	}
	t.Logf("binding: %d admitted in %v (rate × time %.0f, bound %.0f)", admitted, took, rate*took.Seconds(), bound)
}

// TestAFreshLeaseRefusesNoSlotTheLimitHas: a client limit's first 20
// requests (rate 200/s, burst 20: a block of 20) are all admitted — the
// first takes the block itself, its own slot among them. Before, a
// background lease raced the request's own reservation for the burst's
// free slots, and the requests it beat were refused with slots leased
// and unused.
func TestAFreshLeaseRefusesNoSlotTheLimitHas(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	s := start(t, r.URL, Hooks{})
	start := time.Now()
	for i := range 20 {
		if !take(t, s, "fresh", 200, 20) {
			t.Fatalf("request %d of a burst of 20 refused", i+1)
		}
	}
	// A 21st within 5 ms (before one slot comes back at 200/s) is refused.
	if take(t, s, "fresh", 200, 20) && time.Since(start) < 5*time.Millisecond {
		t.Fatal("a 21st request within a burst of 20 was admitted")
	}
	// The same burst at once, 20 requests together: those that find the
	// first one's block on its way wait for it (before, they reserved
	// their own slots while it took them all, and were refused).
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if take(t, s, "together", 200, 20) {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != 20 {
		t.Fatalf("%d of a burst of 20 sent together admitted", n)
	}
}

// TestAReloadedLimitDropsItsLease: a lease taken under a limit of
// 10,000/s is not spent under the 200/s a reload sets: what is left is
// dropped, and no more than a block and a half of the new limit is held.
func TestAReloadedLimitDropsItsLease(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	s := start(t, r.URL, Hooks{})
	newMost := 1.5 * float64(leaseSize(200, 20))
	for i := 0; float64(s.Leased("reloaded")) <= newMost; i++ { // blocks grow with the share taken
		if i == 5000 {
			t.Fatal("no lease beyond the new limit's under the first: the test proves nothing")
		}
		take(t, s, "reloaded", 1e4, 1000)
	}
	take(t, s, "reloaded", 200, 20)
	if n := s.Leased("reloaded"); float64(n) > newMost {
		t.Fatalf("%d slots of the old limit's lease held under the new one", n)
	}
}

// TestALimitTooSmallIsNotLeased: under MinLease slots a block (a rate
// under 200/s, or a burst under 20) every request asks Redis.
func TestALimitTooSmallIsNotLeased(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	s := start(t, r.URL, Hooks{})
	for _, tt := range []struct {
		rate  float64
		burst int
	}{{100, 1000}, {10_000, 10}} {
		for range 50 {
			if s.TakeLeased("small", tt.rate, tt.burst) {
				t.Fatalf("rate %v burst %d was leased", tt.rate, tt.burst)
			}
		}
	}
	if leaseSize(200, 20) != MinLease || leaseSize(199, 1000) != 0 {
		t.Fatal("leaseSize's threshold moved")
	}
}

// TestALeaseLapses: a block unspent LeaseFor after it was taken is
// dropped, and the map of leases stays within MaxLeases.
func TestALeaseLapses(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	s := start(t, r.URL, Hooks{})
	s.TakeLeased("lapse", 1e4, 1000)
	deadline := time.Now().Add(2 * time.Second)
	for s.Leased("lapse") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no lease was taken")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(LeaseFor + 50*time.Millisecond)
	if n := s.Leased("lapse"); n != 0 {
		t.Fatalf("%d slots outlived the lease", n)
	}
	// The next request takes a block of its own (the least, at this
	// rate: MinLease and its slot); the lapsed one's remainder is not in it.
	if !s.TakeLeased("lapse", 1e4, 1000) {
		t.Fatal("the request after a lapse took no block")
	}
	if n := s.Leased("lapse"); n > MinLease {
		t.Fatalf("%d slots held after a lapse; a fresh block of %d was taken", n, MinLease+1)
	}
	for i := range MaxLeases + 100 {
		s.leaseOf("k" + strconv.Itoa(i))
	}
	if n := len(s.leases.m); n > MaxLeases {
		t.Fatalf("%d leases held, bound %d", n, MaxLeases)
	}
}
