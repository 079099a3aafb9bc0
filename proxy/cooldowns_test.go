package proxy

import (
	"testing"
	"time"

	"sturdy/internal/upstreamtest"
)

var noJitter = func(d time.Duration) time.Duration { return d }

// TestBareCooldownsAreSweptAndRunsEnd: keys that only ever got a 429
// without a wait (any model string a client sends makes one) go once
// long expired, so the map stays bounded; and such a run is over by
// itself an hour later (no doubled cooldown).
func TestBareCooldownsAreSweptAndRunsEnd(t *testing.T) {
	t.Parallel()
	var c cooldowns
	past := time.Now().Add(-time.Hour)
	for k := uint64(0); k < 1000; k++ {
		c.bare(k, past, time.Second, noJitter)
	}
	c.bare(1<<41, time.Now(), time.Second, noJitter)
	if n := len(c.m); n != 1 {
		t.Fatalf("%d entries kept, the 1,000 long over are not swept", n)
	}
	if s := c.streaks.Load(); int(s) != len(c.m) {
		t.Fatalf("streaks %d for %d entries in a run", s, len(c.m))
	}
	key := uint64(1 << 40)
	c.bare(key, past, time.Second, noJitter)
	if d, streak := c.bare(key, past.Add(time.Second), time.Second, noJitter); d != 2*time.Second || streak != 2 {
		t.Fatalf("a second bare 429 in a row: %v (streak %d), want 2s", d, streak)
	}
	if d, _ := c.bare(key, time.Now().Add(time.Hour), time.Second, noJitter); d != time.Second {
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
	c := cooldowns{onEvict: func() { evicted++ }}
	now := time.Now()
	for k := uint64(0); k < MaxTrackedKeys+100; k++ {
		c.set(k, now, now.Add(time.Hour+time.Duration(k)*time.Millisecond)) // key k ends k ms later
	}
	if n := len(c.m); n != MaxTrackedKeys || evicted != 100 {
		t.Fatalf("%d cooldowns kept (%d evicted), want %d (100)", n, evicted, MaxTrackedKeys)
	}
	for k := uint64(0); k < 100; k++ {
		if c.remaining(k, now) != 0 {
			t.Fatalf("key %d (among the soonest to end) was kept", k)
		}
	}
	if c.remaining(MaxTrackedKeys+99, now) == 0 || c.remaining(100, now) == 0 {
		t.Fatal("a later-ending cooldown was dropped")
	}
}

// TestCooldownMaxCapsEveryCooldown: whatever a reply or the fleet says, a
// cooldown lasts at most cooldown.max (a bare one too).
func TestCooldownMaxCapsEveryCooldown(t *testing.T) {
	t.Parallel()
	c := cooldowns{max: 10 * time.Minute}
	now := time.Now()
	year := now.Add(365 * 24 * time.Hour)
	if got := c.set(1, now, year); !got.Equal(now.Add(10*time.Minute)) || c.remaining(1, now) != 10*time.Minute {
		t.Fatalf("set a year: recorded %v, %v left", got.Sub(now), c.remaining(1, now))
	}
	if got := c.adopt(2, now, year, 0); !got.Equal(now.Add(10*time.Minute)) || c.remaining(2, now) != 10*time.Minute {
		t.Fatalf("adopted a year: %v, %v left", got.Sub(now), c.remaining(2, now))
	}
	if got := c.set(3, now, now.Add(time.Minute)); !got.Equal(now.Add(time.Minute)) {
		t.Fatalf("a cooldown under the cap was changed: %v", got.Sub(now))
	}
	short := cooldowns{max: 3 * time.Second}
	var d time.Duration
	for i := 0; i < 5; i++ {
		d, _ = short.bare(4, now, time.Second, noJitter)
	}
	if d != 3*time.Second {
		t.Fatalf("the fifth bare 429 in a row: %v, want the cap 3s", d)
	}
}

// TestClientBucketsPastTheBoundDropTheLeastRecentlyUsed: a `clients:`
// limit keeps at most MaxTrackedKeys buckets, however many keys come.
func TestClientBucketsPastTheBoundDropTheLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	evicted := 0
	l := newClientLimiter(ClientLimit{KeyHeader: "Authorization", RequestsPerSecond: 1, Burst: 1}, func() { evicted++ })
	now := time.Now()
	if _, ok := l.take([]byte("Bearer first"), now); !ok {
		t.Fatal("first request refused")
	}
	if _, ok := l.take([]byte("Bearer first"), now); ok {
		t.Fatal("over its limit, but let through")
	}
	key := make([]byte, 8)
	for i := 0; i < MaxTrackedKeys+10; i++ {
		key = append(key[:0], byte(i), byte(i>>8), byte(i>>16), byte(i>>24))
		l.take(key, now)
	}
	if n := l.buckets.Len(); n != MaxTrackedKeys || evicted != 11 {
		t.Fatalf("%d buckets (%d evicted), want %d (11)", n, evicted, MaxTrackedKeys)
	}
}

// TestOneReplyCannotLockAKeyOutForAYear: a 429 with Retry-After of a
// year, or a 200 with x-ratelimit-reset-requests: 8760h, makes a
// cooldown of at most cooldown.max (10 minutes by default); once a capped
// one ends, the next request reaches the upstream. Before, both made a
// cooldown of a year.
func TestOneReplyCannotLockAKeyOutForAYear(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t,
		upstreamtest.Step{Status: 429, Header: [][2]string{{"Retry-After", "31536000"}}},
		upstreamtest.Step{Header: [][2]string{upstreamtest.JSONHeader, {"X-Ratelimit-Remaining-Requests", "0"},
			{"X-Ratelimit-Reset-Requests", "8760h"}}, Body: upstreamtest.ChatCompletion("ok")},
		upstreamtest.Step{Header: [][2]string{upstreamtest.JSONHeader}, Body: upstreamtest.ChatCompletion("ok")})
	h := startProxy(t, up.URL, nil)
	for i, m := range []string{"a", "b"} {
		h.chat(`{"model":"` + m + `","messages":[]}`)
		st := h.p.Upstreams()[0]
		if st.CooldownUntil == nil || time.Until(*st.CooldownUntil) > DefaultCooldownMax+time.Second {
			t.Fatalf("reply %d: cooldown until %v, want at most %v from now", i, st.CooldownUntil, DefaultCooldownMax)
		}
	}

	capped := upstreamtest.Start(t,
		upstreamtest.Step{Status: 429, Header: [][2]string{{"Retry-After", "31536000"}}},
		upstreamtest.Step{Header: [][2]string{upstreamtest.JSONHeader}, Body: upstreamtest.ChatCompletion("ok")})
	h = startProxy(t, capped.URL, func(o *Options) { o.Upstreams[0].Cooldown.Max = 300 * time.Millisecond })
	if resp, _ := h.chat(""); resp.StatusCode != 429 {
		t.Fatalf("the year-long 429: %d", resp.StatusCode)
	}
	if resp, body := h.chat(""); resp.StatusCode != 200 { // waits the capped cooldown out (no fallback)
		t.Fatalf("after the capped cooldown: %d %s", resp.StatusCode, body)
	}
	if n := capped.Count(); n != 2 {
		t.Fatalf("the upstream saw %d requests, want 2", n)
	}
}
