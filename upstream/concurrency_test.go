package upstream

import (
	"fmt"
	"math/rand/v2"
	"sturdy/internal/upstreamtest"
	"testing"
	"time"
)

func testConcurrency(mode ConcurrencyMode, max int) Concurrency {
	return Concurrency{Mode: mode, Max: max}.withDefaults(time.Second)
}

// phase is a model server for a while: slots parallel places, each
// reply's time to first content base (± noise of it, uniformly), plus,
// for a request behind the slots, one base per slots ahead of it inside
// the server (vLLM or Ollama under load: no error, only waiting).
type phase struct {
	slots int
	base  time.Duration
	noise float64
}

// simulate runs g for 3,000 replies per phase under saturating load (the
// limit always full) and returns the mean limit over the last phase's
// last 2,000.
func simulate(g *gradient, phases []phase) float64 {
	r := rand.New(rand.NewPCG(1, 2))
	var sum float64
	for i, p := range phases {
		for n := range 3000 {
			inFlight := max(1, int(g.limit))
			ttft := float64(p.base)*(1+p.noise*(2*r.Float64()-1)) + float64(r.IntN(inFlight)/p.slots)*float64(p.base)
			g.sample(time.Duration(ttft), 100, inFlight)
			if i == len(phases)-1 && n >= 1000 {
				sum += g.limit
			}
		}
	}
	return sum / 2000
}

func TestTheGradientFollowsCapacity(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	type tc struct {
		name   string
		phases []phase
		lo, hi float64
	}
	var cases []tc
	for _, noise := range []float64{0, 0.25, 0.5, 1} {
		// The limit settles between 0.75 and about 3 times the slots:
		// the knee where the replies start tolerance (1.5) times later
		// than their baseline, whatever the noise — a baseline fed only
		// the fast samples once brought it down to 2 at ±75 % noise.
		// (Replies here take no longer than their first content; see
		// TestTheGradientSettlesOnAStreamingServer for streams.)
		for _, c := range []tc{
			{"settles near 8 slots", []phase{{slots: 8, base: 20 * ms}}, 6, 22},
			{"settles near 2 slots", []phase{{slots: 2, base: 20 * ms}}, 1.5, 6},
			{"comes down when capacity halves", []phase{{slots: 8, base: 20 * ms}, {slots: 4, base: 20 * ms}}, 3, 11},
			{"goes back up when it returns", []phase{{slots: 4, base: 20 * ms}, {slots: 8, base: 20 * ms}}, 6, 22},
			// Another model: the baseline is learned again, not stuck at the floor
			// (slower) nor holding a queue of 2× the slots (faster).
			{"follows a model 5× slower", []phase{{slots: 8, base: 20 * ms}, {slots: 8, base: 100 * ms}}, 6, 22},
			{"follows a model 5× faster", []phase{{slots: 8, base: 100 * ms}, {slots: 8, base: 20 * ms}}, 6, 22},
		} {
			c.name = fmt.Sprintf("%s, ±%.0f%% noise", c.name, noise*100)
			for i := range c.phases {
				c.phases[i].noise = noise
			}
			cases = append(cases, c)
		}
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g := newGradient(testConcurrency(ConcurrencyAdaptive, 64))
			got := simulate(&g, tt.phases)
			t.Logf("mean limit %.1f", got)
			if got < tt.lo || got > tt.hi {
				t.Fatalf("mean limit %.1f, want it in [%g, %g]", got, tt.lo, tt.hi)
			}
		})
	}
}

func TestTheGradientsRules(t *testing.T) {
	t.Parallel()
	c := testConcurrency(ConcurrencyAdaptive, 64)
	t.Run("no move before min_samples", func(t *testing.T) {
		t.Parallel()
		g := newGradient(c)
		for range c.Adaptive.MinSamples - 1 {
			g.sample(10*time.Millisecond, 100, 4)
		}
		if g.limit != float64(c.Adaptive.Initial) {
			t.Fatalf("limit %.1f moved before the baseline was known", g.limit)
		}
	})
	t.Run("no growth while under half is used", func(t *testing.T) {
		t.Parallel()
		g := newGradient(c)
		for range 100 {
			g.sample(10*time.Millisecond, 100, 1)
		}
		if g.limit != float64(c.Adaptive.Initial) {
			t.Fatalf("limit %.1f grew with 1 of it in flight", g.limit)
		}
	})
	t.Run("prompt sizes keep their own baselines", func(t *testing.T) {
		t.Parallel()
		g := newGradient(c)
		for i := range 1500 { // long prompts start 10× later, steadily: no load
			size, ttft := 100, 10*time.Millisecond
			if i%2 == 1 {
				size, ttft = 200<<10, 100*time.Millisecond
			}
			g.sample(ttft, size, int(g.limit))
		}
		if g.limit < 32 {
			t.Fatalf("limit %.1f: long prompts were read as load", g.limit)
		}
	})
	t.Run("an overload backs off by a fifth, never under min", func(t *testing.T) {
		t.Parallel()
		g := newGradient(c)
		g.limit = 10
		g.backoff()
		if g.limit != 8 {
			t.Fatalf("limit %.1f after a backoff from 10, want 8", g.limit)
		}
		for range 50 {
			g.backoff()
		}
		if g.limit != float64(c.Adaptive.Min) {
			t.Fatalf("limit %.2f, want the floor %d", g.limit, c.Adaptive.Min)
		}
	})
	t.Run("no allowance for a sample that did not keep pace", func(t *testing.T) {
		t.Parallel()
		g := newGradient(c)
		g.limit, g.buckets[0] = 8, baseline{long: float64(10 * time.Millisecond), n: 100, samples: 100}
		g.sample(20*time.Millisecond, 100, 8) // twice its baseline; the short average still within tolerance
		if g.short > g.o.Tolerance || g.limit != 8 {
			t.Fatalf("limit %.3f (short %.2f) after a slow sample, want it held at 8", g.limit, g.short)
		}
		g.sample(10*time.Millisecond, 100, 8) // one that kept pace: 1/8 of a step
		if g.limit != 8.125 {
			t.Fatalf("limit %.3f after a sample that kept pace, want 8.125", g.limit)
		}
	})
	t.Run("never above max", func(t *testing.T) {
		t.Parallel()
		g := newGradient(testConcurrency(ConcurrencyAdaptive, 6))
		for range 500 {
			g.sample(10*time.Millisecond, 100, int(g.limit))
		}
		if g.limit != 6 {
			t.Fatalf("limit %.1f, want the ceiling 6", g.limit)
		}
	})
}

// acquireAsync starts an acquire and returns where its result goes.
func acquireAsync(c *concurrency, r LeaseRequest) chan LeaseResult {
	ch := make(chan LeaseResult, 1)
	go func() {
		res, _ := c.acquire(r)
		ch <- res
	}()
	return ch
}

// waitQueued waits (up to 2 s) until n requests wait in c's queue.
func waitQueued(t *testing.T, c *concurrency, n int) {
	t.Helper()
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		c.mu.Lock()
		w := c.waiting
		c.mu.Unlock()
		if w == n {
			return
		}
	}
	t.Fatalf("%d waiting, want %d", c.waiting, n)
}

func TestTheConcurrencyQueue(t *testing.T) {
	t.Parallel()
	long := LeaseRequest{Wait: 5 * time.Second}
	t.Run("interactive before batch, tenants in turn", func(t *testing.T) {
		t.Parallel()
		c := newConcurrency(testConcurrency(ConcurrencyFixed, 1))
		if res, _ := c.acquire(long); res != LeaseTaken {
			t.Fatal("the first place was not taken at once")
		}
		var order []chan LeaseResult
		for _, r := range []LeaseRequest{
			{Wait: 5 * time.Second, Priority: PriorityBatch, Tenant: 1},
			{Wait: 5 * time.Second, Tenant: 1},
			{Wait: 5 * time.Second, Tenant: 1},
			{Wait: 5 * time.Second, Tenant: 2},
		} {
			order = append(order, acquireAsync(c, r))
			waitQueued(t, c, len(order))
		}
		// Interactive first, tenant 1 and 2 in turn, then batch.
		for _, i := range []int{1, 3, 2, 0} {
			c.release(PriorityInteractive, Sample{}, time.Time{}, time.Now())
			if res := <-order[i]; res != LeaseWaited {
				t.Fatalf("waiter %d: %v", i, res)
			}
		}
	})
	t.Run("batch gets every fourth place while interactive waits", func(t *testing.T) {
		t.Parallel()
		c := newConcurrency(testConcurrency(ConcurrencyFixed, 1))
		c.acquire(long)
		b := acquireAsync(c, LeaseRequest{Wait: 5 * time.Second, Priority: PriorityBatch})
		waitQueued(t, c, 1)
		is := make([]chan LeaseResult, 4)
		for i := range is {
			is[i] = acquireAsync(c, long)
			waitQueued(t, c, i+2)
		}
		for i := range 3 {
			c.release(PriorityInteractive, Sample{}, time.Time{}, time.Now())
			<-is[i]
		}
		c.release(PriorityInteractive, Sample{}, time.Time{}, time.Now())
		select {
		case <-b:
		case <-is[3]:
			t.Fatal("the fourth place went to interactive: batch starves")
		}
	})
	t.Run("batch holds at most its share", func(t *testing.T) {
		t.Parallel()
		cc := testConcurrency(ConcurrencyFixed, 4)
		cc.BatchShare = 0.5
		c := newConcurrency(cc)
		batch := LeaseRequest{Wait: 20 * time.Millisecond, Priority: PriorityBatch}
		for range 2 {
			if res, _ := c.acquire(batch); res != LeaseTaken {
				t.Fatal("batch under its share waited")
			}
		}
		if res, _ := c.acquire(batch); res != LeaseTimedOut {
			t.Fatalf("a third batch request: %v, want it held back", res)
		}
		if res, _ := c.acquire(LeaseRequest{}); res != LeaseTaken {
			t.Fatal("interactive found no place beside batch's share")
		}
	})
	t.Run("interactive takes a free place past batch held at its share", func(t *testing.T) {
		t.Parallel()
		c := newConcurrency(testConcurrency(ConcurrencyFixed, 4)) // batch may hold 3
		batch := LeaseRequest{Wait: 5 * time.Second, Priority: PriorityBatch}
		for range 3 {
			c.acquire(batch)
		}
		queued := acquireAsync(c, batch)
		waitQueued(t, c, 1)
		if res, _ := c.acquire(LeaseRequest{Wait: 50 * time.Millisecond}); res != LeaseTaken {
			t.Fatalf("%v: interactive waited behind batch that cannot be served, a place free", res)
		}
		c.release(PriorityBatch, Sample{}, time.Time{}, time.Now())
		if res := <-queued; res != LeaseWaited {
			t.Fatalf("the queued batch request: %v", res)
		}
	})
	t.Run("a stalled queue is not told its old drain", func(t *testing.T) {
		t.Parallel()
		cc := testConcurrency(ConcurrencyFixed, 1)
		cc.Queue.Timeout = 10 * time.Second
		c := newConcurrency(cc)
		hourAgo := time.Now().Add(-time.Hour)
		c.acquire(LeaseRequest{})
		c.release(PriorityInteractive, Sample{}, time.Time{}, hourAgo)
		c.acquire(LeaseRequest{})
		c.release(PriorityInteractive, Sample{}, time.Time{}, hourAgo.Add(time.Millisecond)) // freed 1 ms apart, an hour ago
		c.acquire(LeaseRequest{})
		if _, ra := c.acquire(LeaseRequest{}); ra < time.Second {
			t.Fatalf("retry after %s from an hour-old drain: the queue has been stalled since", ra)
		}
	})
	t.Run("a full queue sheds at once, with a wait from its drain", func(t *testing.T) {
		t.Parallel()
		cc := testConcurrency(ConcurrencyFixed, 1)
		cc.Queue.Max = 1
		c := newConcurrency(cc)
		c.acquire(long)
		now := time.Now()
		c.release(PriorityInteractive, Sample{}, time.Time{}, now) // a place freed every 100 ms
		c.acquire(long)
		c.release(PriorityInteractive, Sample{}, time.Time{}, now.Add(100*time.Millisecond))
		c.acquire(long)
		w := acquireAsync(c, long)
		waitQueued(t, c, 1)
		start := time.Now()
		res, ra := c.acquire(long)
		if res != LeaseTimedOut || time.Since(start) > time.Second {
			t.Fatalf("%v after %s, want shed at once", res, time.Since(start))
		}
		if ra < 150*time.Millisecond || ra > 250*time.Millisecond {
			t.Fatalf("retry after %s, want about two places' drain (200 ms)", ra)
		}
		c.release(PriorityInteractive, Sample{}, time.Time{}, time.Now())
		<-w
	})
	t.Run("a tenant flooding a full queue gives way to another", func(t *testing.T) {
		t.Parallel()
		cc := testConcurrency(ConcurrencyFixed, 1)
		cc.Queue.Max = 2
		c := newConcurrency(cc)
		a, b := LeaseRequest{Wait: 5 * time.Second, Tenant: 1}, LeaseRequest{Wait: 5 * time.Second, Tenant: 2}
		c.acquire(a)
		a1 := acquireAsync(c, a)
		waitQueued(t, c, 1)
		a2 := acquireAsync(c, a)
		waitQueued(t, c, 2) // full, all A's
		b1 := acquireAsync(c, b)
		if res := <-a2; res != LeaseTimedOut {
			t.Fatalf("A's newest: %v, want it turned away for B", res)
		}
		waitQueued(t, c, 2)
		for _, r := range []LeaseRequest{a, b} { // one each now: a newcomer of either is shed
			if res, _ := c.acquire(r); res != LeaseTimedOut {
				t.Fatalf("tenant %d with the queue full and even: %v, want shed", r.Tenant, res)
			}
		}
		batch := b
		batch.Priority = PriorityBatch
		c.release(PriorityInteractive, Sample{}, time.Time{}, time.Now())
		if res := <-a1; res != LeaseWaited {
			t.Fatalf("A's first: %v", res)
		}
		bt := acquireAsync(c, batch)
		waitQueued(t, c, 2)
		i3 := acquireAsync(c, LeaseRequest{Wait: 5 * time.Second, Tenant: 3})
		if res := <-bt; res != LeaseTimedOut {
			t.Fatalf("batch: %v, want it turned away for an interactive newcomer", res)
		}
		for _, w := range []chan LeaseResult{b1, i3} {
			c.release(PriorityInteractive, Sample{}, time.Time{}, time.Now())
			if res := <-w; res != LeaseWaited {
				t.Fatalf("%v, want a place", res)
			}
		}
	})
	t.Run("a wait times out, a client leaving leaves the queue", func(t *testing.T) {
		t.Parallel()
		c := newConcurrency(testConcurrency(ConcurrencyFixed, 1))
		c.acquire(long)
		if res, _ := c.acquire(LeaseRequest{Wait: 20 * time.Millisecond}); res != LeaseTimedOut {
			t.Fatalf("%v, want a timeout", res)
		}
		gone := make(chan struct{})
		w := acquireAsync(c, LeaseRequest{Wait: 5 * time.Second, Gone: gone})
		waitQueued(t, c, 1)
		close(gone)
		if res := <-w; res != LeaseCancelled {
			t.Fatalf("%v, want cancelled", res)
		}
		waitQueued(t, c, 0)
		c.release(PriorityInteractive, Sample{}, time.Time{}, time.Now())
		if st := c.status(); st.InFlight != 0 {
			t.Fatalf("%d in flight after every place went back", st.InFlight)
		}
	})
}

func TestABurstOfOverloadsBacksOffOncePerRoundTrip(t *testing.T) {
	t.Parallel()
	c := newConcurrency(testConcurrency(ConcurrencyAdaptive, 64))
	c.g.limit = 10
	sent := time.Now()
	for range 10 { // ten in flight, all sent under the limit of 10
		if res, _ := c.acquire(LeaseRequest{}); res != LeaseTaken {
			t.Fatal("a place under the limit was not taken")
		}
	}
	at := sent.Add(time.Second)
	for i := range 10 { // …and all meet a 503 together
		c.release(PriorityInteractive, Sample{Overload: true}, sent, at.Add(time.Duration(i)*time.Millisecond))
	}
	if c.g.limit != 8 {
		t.Fatalf("limit %.2f after a burst of 10 overloads from 10, want 8: one cut per round trip, not 0.8¹⁰", c.g.limit)
	}
	c.acquire(LeaseRequest{})
	c.release(PriorityInteractive, Sample{Overload: true}, at.Add(time.Second), at.Add(2*time.Second))
	if c.g.limit != 6.4 {
		t.Fatalf("limit %.2f, want 6.4: an overload of one sent after the cut cuts again", c.g.limit)
	}
}

func TestAPoolSendsARequestElsewhereBeforeItIsShed(t *testing.T) {
	t.Parallel()
	for name, b := range map[string]Balance{"least_requests": BalanceLeastRequests, "round_robin": BalanceRoundRobin,
		"affinity": BalanceAffinity} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a, z := upstreamtest.Start(t, upstreamtest.Step{Body: "{}"}), upstreamtest.Start(t, upstreamtest.Step{Body: "{}"})
			o := Options{Name: "up", Endpoints: []string{a.URL, z.URL}, Balance: b, MaxConnections: 8,
				Concurrency: Concurrency{Mode: ConcurrencyFixed, Max: 1, Queue: Queue{Max: 1}}}
			up, err := New(testEnv(), o.WithDefaults(), nil)
			if err != nil {
				t.Fatal(err)
			}
			up.Own()
			t.Cleanup(up.Close)
			eps := up.Endpoints()
			for _, ep := range eps { // both at their limit…
				if l, res := ep.Lease(LeaseRequest{}); res != LeaseTaken {
					t.Fatal("no place")
				} else {
					t.Cleanup(func() { l.Release(Sample{}) })
				}
			}
			gone := make(chan struct{})
			t.Cleanup(func() { close(gone) })
			go eps[0].Lease(LeaseRequest{Wait: 10 * time.Second, Gone: gone}) // …and the first one's queue full
			waitQueued(t, eps[0].conc, 1)
			for key := range uint64(20) {
				if ep := up.Pick(&Ask{Key: key, HasKey: true, Rand: func(n int64) int64 { return int64(key) % n }}); ep != eps[1] {
					t.Fatalf("pick %d went to %s, whose queue is full, with room in %s's", key, ep.Addr(), eps[1].Addr())
				}
			}
		})
	}
}

// BenchmarkConcurrencyLease is the cost of a place under an endpoint's
// limit with a free one: acquire, a stream's first content observed (the
// adaptive law's work), release. Target: under 2 µs, 0 allocations.
func BenchmarkConcurrencyLease(b *testing.B) {
	c := newConcurrency(testConcurrency(ConcurrencyAdaptive, 64))
	s := Sample{TTFT: 20 * time.Millisecond, Counts: true, Streamed: true, Size: 1000}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		if res, _ := c.acquire(LeaseRequest{Tenant: 1}); res != LeaseTaken {
			b.Fatal("no place")
		}
		c.observe(s)
		c.release(PriorityInteractive, s, now, now)
	}
}

// BenchmarkEndpointLease is the same through an endpoint: its connection
// place and clock reads too, as an attempt takes and gives back a lease.
func BenchmarkEndpointLease(b *testing.B) {
	o := Options{Name: "up", URL: "http://127.0.0.1:1", MaxConnections: 8,
		Concurrency: Concurrency{Mode: ConcurrencyAdaptive}}
	up, err := New(testEnv(), o.WithDefaults(), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer up.Close()
	ep := up.Endpoints()[0]
	s := Sample{TTFT: 20 * time.Millisecond, Counts: true, Streamed: true, Size: 1000}
	b.ReportAllocs()
	for b.Loop() {
		l, res := ep.Lease(LeaseRequest{Tenant: 1})
		if res != LeaseTaken {
			b.Fatal("no place")
		}
		l.Observe(s)
		l.Release(s)
	}
}

// TestAGrownLimitLetsAWaiterIn: a first content that raises the limit
// gives the new place to a waiter at once — not when a reply next ends,
// a whole stream later.
func TestAGrownLimitLetsAWaiterIn(t *testing.T) {
	t.Parallel()
	c := newConcurrency(testConcurrency(ConcurrencyAdaptive, 64))
	c.g.limit, c.g.buckets[0] = 1.99, baseline{long: float64(10 * time.Millisecond), n: 100, samples: 100}
	if res, _ := c.acquire(LeaseRequest{}); res != LeaseTaken {
		t.Fatal("no place")
	}
	waiter := acquireAsync(c, LeaseRequest{Wait: 5 * time.Second})
	waitQueued(t, c, 1)
	c.observe(Sample{TTFT: 10 * time.Millisecond, Counts: true, Streamed: true, Size: 100})
	select {
	case res := <-waiter:
		if res != LeaseWaited {
			t.Fatalf("the waiter got %v", res)
		}
	case <-time.After(2 * time.Second):
		t.Fatalf("the limit grew to %.2f and the waiter still waits", c.g.limit)
	}
}

// TestAnAdaptiveLimitRecoversOnWholeReplies: an endpoint serving only
// replies that are no streams (no samples) is backed off by a burst of
// 503s, then climbs back to its initial limit as replies end well with
// the limit full. Before, it stayed at its floor for good: throughput
// 39/s → 4/s, the server's slots idle.
func TestAnAdaptiveLimitRecoversOnWholeReplies(t *testing.T) {
	t.Parallel()
	c := newConcurrency(Concurrency{Mode: ConcurrencyAdaptive, Max: 64, Adaptive: Adaptive{Initial: 4, Min: 1, Tolerance: 2, Smoothing: 0.2, MinSamples: 10}})
	now := time.Unix(1_800_000_000, 0)
	for i := range 20 { // a 503 burst: a back-off a round trip
		now = now.Add(time.Second)
		c.mu.Lock()
		c.take(PriorityInteractive)
		c.mu.Unlock()
		c.release(PriorityInteractive, Sample{Overload: true}, now.Add(-time.Millisecond), now)
		_ = i
	}
	if l := c.limit(); l != 1 {
		t.Fatalf("after the burst the limit is %d, want the floor 1", l)
	}
	for range 40 { // whole replies, each with the limit full
		c.mu.Lock()
		for c.inFlight < c.limit() {
			c.take(PriorityInteractive)
		}
		c.mu.Unlock()
		now = now.Add(100 * time.Millisecond)
		c.release(PriorityInteractive, Sample{Counts: true, TTFT: 50 * time.Millisecond}, now.Add(-50*time.Millisecond), now)
		c.mu.Lock()
		for c.inFlight > 0 {
			c.put(PriorityInteractive)
		}
		c.mu.Unlock()
	}
	if l := c.limit(); l != 4 {
		t.Fatalf("after 40 whole replies with the limit full it is %d, want the initial 4", l)
	}
}
