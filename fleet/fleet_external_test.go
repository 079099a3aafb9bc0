//go:build external

package fleet

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/time/rate"

	"sturdy/internal/redistest"
)

func start(t *testing.T, url string, hooks Hooks) *State {
	t.Helper()
	s, err := New(Config{URL: url, Prefix: "t:", Timeout: 200 * time.Millisecond, ShareBreakers: true}, zerolog.Nop(), hooks)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	// Its first beat (the heartbeat script's first call is two) made, so
	// that a test counting script calls counts its own only: the next is
	// replicaBeat away.
	for end := time.Now().Add(5 * time.Second); s.replicas.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the first heartbeat did not come in 5s")
		}
	}
	return s
}

// TestCooldownsReachTheFleet: a cooldown one replica publishes reaches
// another within 100 ms, and one that starts later loads it.
func TestCooldownsReachTheFleet(t *testing.T) {
	r := redistest.Start(t)
	got := make(chan Cooldown, 4)
	start(t, r.URL, Hooks{Cooldown: func(c Cooldown) time.Time { got <- c; return c.Until }})
	a := start(t, r.URL, Hooks{})
	time.Sleep(100 * time.Millisecond) // b subscribed
	c := Cooldown{Upstream: "openai", Key: Digest("", []byte("k"), []byte("m")), Until: time.Now().Add(5 * time.Second), Streak: 2}
	sent := time.Now()
	a.PublishCooldown(c)
	select {
	case g := <-got:
		if g.Upstream != c.Upstream || g.Key != c.Key || g.Until.UnixMilli() != c.Until.UnixMilli() || g.Streak != 2 {
			t.Fatalf("got %+v, want %+v", g, c)
		}
		d := time.Since(sent)
		if d > 100*time.Millisecond {
			t.Fatalf("took %v", d)
		}
		t.Logf("a cooldown reached the other replica in %v", d)
	case <-time.After(time.Second):
		t.Fatal("the cooldown never reached the other replica")
	}
	late := make(chan Cooldown, 4)
	start(t, r.URL, Hooks{Cooldown: func(c Cooldown) time.Time { late <- c; return c.Until }})
	select {
	case g := <-late:
		if g.Key != c.Key {
			t.Fatalf("loaded %+v", g)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a replica that started later did not load the cooldown in force")
	}
}

// TestReserveMatchesTheLocalLimiter: the GCRA script grants and delays
// as rate.Limiter.Reserve does for the same sequence.
func TestReserveMatchesTheLocalLimiter(t *testing.T) {
	r := redistest.Start(t)
	s := start(t, r.URL, Hooks{})
	for _, tt := range []struct {
		rate  float64
		burst int
		wait  time.Duration
	}{{10, 1, time.Second}, {10, 5, 200 * time.Millisecond}, {0.5, 2, 0}, {2, 3, 1200 * time.Millisecond}} { // slow enough that the calls take no token's worth of time
		lim := rate.NewLimiter(rate.Limit(tt.rate), tt.burst)
		name := time.Now().String()
		now := time.Now()
		for i := 0; i < 3*tt.burst+3; i++ {
			res := lim.ReserveN(now, 1)
			want := res.DelayFrom(now)
			wantTaken := want <= tt.wait
			if !wantTaken {
				res.CancelAt(now)
			}
			delay, taken, err := s.Reserve(name, tt.rate, tt.burst, tt.wait)
			if err != nil {
				t.Fatal(err)
			}
			elapsed := time.Since(now) // Redis's clock runs on meanwhile
			if taken != wantTaken || delay > want || delay < want-elapsed-time.Millisecond {
				t.Fatalf("rate %v burst %d, reservation %d: taken %v delay %v, local %v %v", tt.rate, tt.burst, i, taken, delay,
					wantTaken, want)
			}
		}
	}
}

// TestRedisDownIsAnErrorWithinTheTimeout: a dead Redis answers no call
// slower than the timeout, is reported down once, and up again once it
// returns.
func TestRedisDownIsAnErrorWithinTheTimeout(t *testing.T) {
	r := redistest.Start(t)
	var mu sync.Mutex
	var ups []bool
	s := start(t, r.URL, Hooks{Up: func(up bool) { mu.Lock(); ups = append(ups, up); mu.Unlock() }})
	if _, _, err := s.Reserve("x", 10, 1, 0); err != nil {
		t.Fatal(err)
	}
	r.Kill()
	for i := 0; i < 5; i++ {
		start := time.Now()
		if _, _, err := s.Reserve("x", 10, 1, 0); err == nil {
			t.Fatal("a dead Redis answered")
		}
		if d := time.Since(start); d > 300*time.Millisecond {
			t.Fatalf("a call waited %v on a dead Redis (timeout 200ms)", d)
		}
	}
	if s.Up() {
		t.Fatal("still up")
	}
	r.Restart()
	deadline := time.Now().Add(3 * time.Second)
	for _, _, err := s.Reserve("x", 10, 1, time.Second); err != nil; _, _, err = s.Reserve("x", 10, 1, time.Second) {
		if time.Now().After(deadline) {
			t.Fatalf("never reachable again: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ups) != 2 || ups[0] || !ups[1] {
		t.Fatalf("transitions %v, want [false true]", ups)
	}
}

// TestOneSlowReplyDoesNotTurnTheFleetOff: after a call timed out, Redis
// healthy, calls try it again within a second and it is up again.
func TestOneSlowReplyDoesNotTurnTheFleetOff(t *testing.T) {
	r := redistest.Start(t)
	s := start(t, r.URL, Hooks{})
	s.result("reserve", context.DeadlineExceeded)
	if s.Up() {
		t.Fatal("a timeout left it up")
	}
	deadline := time.Now().Add(3 * time.Second)
	for !s.Up() {
		if time.Now().After(deadline) {
			t.Fatal("one slow reply turned the fleet off for good")
		}
		if s.Usable() {
			_, _, _ = s.Reserve("probe", 10, 1, 0)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLoadingCooldownsIsPagedAndBounded: a (re)connect reads the
// cooldowns a page at a time and adopts at most MaxCooldowns of them,
// however many Redis holds. Before, every key was read (and adopted)
// at once.
func TestLoadingCooldownsIsPagedAndBounded(t *testing.T) {
	r := redistest.Start(t)
	a := start(t, r.URL, Hooks{})
	until := time.Now().Add(time.Hour)
	pipe := a.rdb.Pipeline()
	for i := 0; i < 2500; i++ {
		k := Digest("", []byte{byte(i), byte(i >> 8)}, []byte("m"))
		pipe.Set(context.Background(), a.cooldownKey("up", k), strconv.FormatInt(until.UnixMilli(), 10)+":0", time.Hour)
	}
	if _, err := pipe.Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	adopted := 0
	s, err := New(Config{URL: r.URL, Prefix: "t:", Timeout: 200 * time.Millisecond, MaxCooldowns: 1000}, zerolog.Nop(),
		Hooks{Cooldown: func(c Cooldown) time.Time {
			mu.Lock()
			adopted++
			mu.Unlock()
			return c.Until
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if adopted != 1000 {
		t.Fatalf("%d cooldowns adopted of 2,500 in Redis, want the bound 1,000", adopted)
	}
}
