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

	const rate, burst = 1000.0, 100
	most := leaseSize(rate, burst)
	admitted, took := run("bound", rate, burst, 1500, 500*time.Microsecond)
	bound := rate*took.Seconds() + burst + 2*1.5*float64(most)
	if float64(admitted) > bound || float64(admitted) < 0.7*rate*took.Seconds() {
		t.Fatalf("binding: %d admitted in %v; want ≤ %.0f (rate × time + burst + leases) and ≥ 0.7 × rate × time", admitted, took, bound)
	}
	t.Logf("binding: %d admitted in %v (rate × time %.0f, bound %.0f)", admitted, took, rate*took.Seconds(), bound)
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
	if s.TakeLeased("lapse", 1e4, 1000) {
		t.Fatal("a lapsed lease's slot was spent")
	}
	for i := range MaxLeases + 100 {
		s.leaseOf("k" + strconv.Itoa(i))
	}
	if n := len(s.leases.m); n > MaxLeases {
		t.Fatalf("%d leases held, bound %d", n, MaxLeases)
	}
}
