package proxy

import (
	"testing"
	"time"
)

// TestBareCooldownsAreSweptAndRunsEnd: keys that only ever got a 429
// without a wait (any model string a client sends makes one) are swept
// once long expired, so the map stays bounded; and such a run is over by
// itself an hour later (no doubled cooldown).
func TestBareCooldownsAreSweptAndRunsEnd(t *testing.T) {
	var c cooldowns
	noJitter := func(d time.Duration) time.Duration { return d }
	past := time.Now().Add(-time.Hour)
	for k := uint64(0); k < 3*maxTrackedKeys; k++ {
		c.bare(k, past, time.Second, noJitter)
	}
	if n := len(c.m); n > maxTrackedKeys+1 {
		t.Fatalf("%d entries kept, the bound is %d", n, maxTrackedKeys)
	}
	if s := c.streaks.Load(); int(s) != len(c.m) {
		t.Fatalf("streaks %d for %d entries in a run", s, len(c.m))
	}
	key := uint64(1 << 40)
	c.bare(key, past, time.Second, noJitter)
	if d, streak := c.bare(key, past.Add(time.Second), time.Second, noJitter); d != 2*time.Second || streak != 2 {
		t.Fatalf("a second bare 429 in a row: %v, want 2s", d)
	}
	if d, _ := c.bare(key, time.Now(), time.Second, noJitter); d != time.Second {
		t.Fatalf("a bare 429 an hour after the run: %v, want 1s", d)
	}
}
