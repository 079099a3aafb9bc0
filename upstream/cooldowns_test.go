package upstream

import (
	"testing"
	"time"
)

var noJitter = func(d time.Duration) time.Duration { return d }

// TestBareCooldownsAreSweptAndRunsEnd: keys that only ever got a 429
// without a wait (any model string a client sends makes one) go once
// long expired, so the map stays bounded; and such a run is over by
// itself an hour later (no doubled cooldown).
func TestBareCooldownsAreSweptAndRunsEnd(t *testing.T) {
	t.Parallel()
	var c Cooldowns
	past := time.Now().Add(-time.Hour)
	for k := uint64(0); k < 1000; k++ {
		c.Bare(k, past, time.Second, noJitter)
	}
	c.Bare(1<<41, time.Now(), time.Second, noJitter)
	if n := len(c.m); n != 1 {
		t.Fatalf("%d entries kept, the 1,000 long over are not swept", n)
	}
	if s := c.streaks.Load(); int(s) != len(c.m) {
		t.Fatalf("streaks %d for %d entries in a run", s, len(c.m))
	}
	key := uint64(1 << 40)
	c.Bare(key, past, time.Second, noJitter)
	if d, streak := c.Bare(key, past.Add(time.Second), time.Second, noJitter); d != 2*time.Second || streak != 2 {
		t.Fatalf("a second bare 429 in a row: %v (streak %d), want 2s", d, streak)
	}
	if d, _ := c.Bare(key, time.Now().Add(time.Hour), time.Second, noJitter); d != time.Second {
		t.Fatalf("a bare 429 an hour after the run: %v, want 1s", d)
	}
}

// TestCooldownsPastTheBoundDropTheSoonestEnding: live cooldowns for more
// keys than MaxTrackedKeys keep the map at the bound; each insert past it
// drops the cooldown that ends soonest (counted), never a later one.
// Before, the map grew past the bound and walked itself on every insert.
func TestCooldownsPastTheBoundDropTheSoonestEnding(t *testing.T) {
	t.Parallel()
	evicted := 0
	c := Cooldowns{onEvict: func() { evicted++ }}
	now := time.Now()
	for k := uint64(0); k < MaxTrackedKeys+100; k++ {
		c.Set(k, now, now.Add(time.Hour+time.Duration(k)*time.Millisecond)) // key k ends k ms later
	}
	if n := len(c.m); n != MaxTrackedKeys || evicted != 100 {
		t.Fatalf("%d cooldowns kept (%d evicted), want %d (100)", n, evicted, MaxTrackedKeys)
	}
	for k := uint64(0); k < 100; k++ {
		if c.Remaining(k, now) != 0 {
			t.Fatalf("key %d (among the soonest to end) was kept", k)
		}
	}
	if c.Remaining(MaxTrackedKeys+99, now) == 0 || c.Remaining(100, now) == 0 {
		t.Fatal("a later-ending cooldown was dropped")
	}
}

// TestCooldownMaxCapsEveryCooldown: whatever a reply or the fleet says, a
// cooldown lasts at most cooldown.max (a bare one too).
func TestCooldownMaxCapsEveryCooldown(t *testing.T) {
	t.Parallel()
	c := Cooldowns{max: 10 * time.Minute}
	now := time.Now()
	year := now.Add(365 * 24 * time.Hour)
	if got := c.Set(1, now, year); !got.Equal(now.Add(10*time.Minute)) || c.Remaining(1, now) != 10*time.Minute {
		t.Fatalf("set a year: recorded %v, %v left", got.Sub(now), c.Remaining(1, now))
	}
	if got := c.Adopt(2, now, year, 0); !got.Equal(now.Add(10*time.Minute)) || c.Remaining(2, now) != 10*time.Minute {
		t.Fatalf("adopted a year: %v, %v left", got.Sub(now), c.Remaining(2, now))
	}
	if got := c.Set(3, now, now.Add(time.Minute)); !got.Equal(now.Add(time.Minute)) {
		t.Fatalf("a cooldown under the cap was changed: %v", got.Sub(now))
	}
	short := Cooldowns{max: 3 * time.Second}
	var d time.Duration
	for i := 0; i < 5; i++ {
		d, _ = short.Bare(4, now, time.Second, noJitter)
	}
	if d != 3*time.Second {
		t.Fatalf("the fifth bare 429 in a row: %v, want the cap 3s", d)
	}
}
